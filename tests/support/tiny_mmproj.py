# Written with the `gguf` package (llama.cpp's own GGUF writer; gguf>=0.19 in requirements-dev.txt).
"""A tiny multimodal projector ("mmproj") GGUF with random weights, for testing the wiring of image
input through llama.cpp's libmtmd (as bundled in llama-cpp-python) with a small text model such as
SmolLM2-135M-Instruct (a llama-architecture model, n_embd 576).

The file is a LLaVA-1.5-style CLIP vision encoder ("clip.projector_type" = "mlp"): one transformer
block, hidden size 32, a 16x16 input image cut into 8x8 patches (so 4 image tokens per image),
and the two-layer "mlp" projector (mm.0 -> GELU -> mm.2) whose output width equals the text model's
n_embd. The weights are random (seeded, so the file is the same on every run): the text model's
answers about an image are nonsense, which is fine for what it is for.

Keys and tensor names follow llama.cpp's tools/mtmd/clip-impl.h and clip.cpp (load_hparams,
load_tensors; the graph is models/llava.cpp). With the "mlp" projector, llava's graph runs the
encoder up to its second-to-last block, so with one block the block's weights are loaded but not
run; the patch/position embeddings, pre-norm and the projector are.
"""

from __future__ import annotations

import pathlib

import numpy as np

IMAGE_SIZE = 16
PATCH_SIZE = 8
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 4
_HIDDEN = 32  # vision encoder width
_N_HEAD = 2
_N_FF = 64
_MM_HIDDEN = 32  # width of the projector's hidden layer
_N_LAYER = 1
_SEED = 1234


def build(path: pathlib.Path, n_embd: int = 576) -> pathlib.Path:
    """Write the tiny mmproj GGUF to `path` (overwriting it) and return `path`.

    `n_embd` is the text model's embedding size, which the projector's output must match
    (576 for SmolLM2-135M)."""
    import gguf  # imported here so that importing this module costs nothing

    path = pathlib.Path(path)
    rng = np.random.default_rng(_SEED)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    h, p = _HIDDEN, PATCH_SIZE
    n_pos = N_IMAGE_TOKENS + 1  # + the class embedding

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "tiny-random-mmproj")
    writer.add_string("general.description", "random-weight LLaVA-style mmproj for tests")
    writer.add_uint32("general.file_type", 0)  # all f32
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_llava_projector", True)  # legacy key, harmless
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    writer.add_uint32("clip.vision.embedding_length", h)
    writer.add_uint32("clip.vision.feed_forward_length", _N_FF)
    writer.add_uint32("clip.vision.projection_dim", n_embd)
    writer.add_uint32("clip.vision.attention.head_count", _N_HEAD)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.block_count", _N_LAYER)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])

    # numpy shapes are (outer, ..., inner); the writer reverses them into ggml's ne order
    tensors: dict[str, np.ndarray] = {
        "v.class_embd": rand(h),
        "v.patch_embd.weight": rand(h, 3, p, p),  # ggml ne [p, p, 3, h], a conv2d kernel
        "v.position_embd.weight": rand(n_pos, h),
        "v.pre_ln.weight": ones(h),
        "v.pre_ln.bias": zeros(h),
    }
    for il in range(_N_LAYER):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"] = rand(h, h)
            tensors[f"{blk}.{name}.bias"] = zeros(h)
        tensors[f"{blk}.ln1.weight"] = ones(h)
        tensors[f"{blk}.ln1.bias"] = zeros(h)
        tensors[f"{blk}.ln2.weight"] = ones(h)
        tensors[f"{blk}.ln2.bias"] = zeros(h)
        tensors[f"{blk}.ffn_up.weight"] = rand(_N_FF, h)  # h -> n_ff
        tensors[f"{blk}.ffn_up.bias"] = zeros(_N_FF)
        tensors[f"{blk}.ffn_down.weight"] = rand(h, _N_FF)  # n_ff -> h
        tensors[f"{blk}.ffn_down.bias"] = zeros(h)
    tensors["mm.0.weight"] = rand(_MM_HIDDEN, h)  # h -> mm hidden
    tensors["mm.0.bias"] = zeros(_MM_HIDDEN)
    tensors["mm.2.weight"] = rand(n_embd, _MM_HIDDEN)  # mm hidden -> text n_embd
    tensors["mm.2.bias"] = zeros(n_embd)

    for name, data in tensors.items():
        writer.add_tensor(name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
