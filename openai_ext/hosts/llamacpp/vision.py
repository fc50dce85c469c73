"""Images in prompts for the embedded llama.cpp host: a projector file (mmproj) beside the
model, read by llama.cpp's libmtmd (llama-cpp-python's ``mtmd_cpp``), as llama-server does.

A prompt with images is the text with one ``<__media__>`` placeholder per image (the families
put them where the images were, text/chat.py). ``tokens`` splits it with ``mtmd_tokenize`` into
text and image chunks: a text chunk gives its token ids, an image chunk as many ids as the
model reads image tokens, all the same negative id made from the image's bytes. So the prompt's
length (usage, the context check) counts every image token, and the batch's prefix reuse
matches an image only where the same image stands (llamacpp/batch.py).

``Media`` is what one generation needs at run time: the chunks again, and where each image run
starts in its tokens; the batch's thread evaluates a run, when the sequence's prompt reaches it,
with ``mtmd_helper_eval_chunk_single`` (the projector encodes the image; its embeddings are
decoded into the sequence's cells), then goes on with the text.

Projectors whose model places image tokens on 2-D positions (M-RoPE: Qwen2-VL and its kind) are
refused at load: the batch gives a sequence's tokens consecutive positions."""

from __future__ import annotations

import ctypes
import hashlib
import io
import multiprocessing
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

MARKER = "<__media__>"


def image_id(data: bytes) -> int:
    """The id that every token of an image stands as: negative (no vocabulary id is), the same
    for the same image bytes."""
    return -1 - int.from_bytes(hashlib.sha256(data).digest()[:4], "little") % (1 << 30)


def rgb(image: Any) -> tuple[int, int, bytes]:
    """A PIL image (or encoded image bytes) as width, height and raw RGB bytes."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray)):
        image = Image.open(io.BytesIO(image))
    image = image.convert("RGB")
    return image.width, image.height, image.tobytes()


@dataclass
class Media:
    """The chunks of one prompt and where each image run starts in its tokens (start -> chunk)."""
    vision: "Vision"
    chunks: Any
    runs: dict[int, tuple[Any, int]] = field(default_factory=dict)   # start -> (chunk, n_tokens)
    tokens: list[int] = field(default_factory=list)

    def run_at(self, n_past: int) -> tuple[Any, int] | None:
        return self.runs.get(n_past)

    def next_run(self, n_past: int) -> int | None:
        """Where the next image run at or after ``n_past`` starts."""
        return min((s for s in self.runs if s >= n_past), default=None)

    def close(self) -> None:
        if self.chunks is not None:
            self.vision.M.mtmd_input_chunks_free(self.chunks)
            self.chunks = None


class Vision:
    """The projector, loaded for one model and context; ``close`` frees it."""

    def __init__(self, mmproj: Path, model: Any, *, n_threads: int | None = None):
        from llama_cpp import _logger
        from llama_cpp import mtmd_cpp as M

        self.M = M
        # libmtmd's log goes where llama.cpp's goes (quiet unless verbose), through the module's own
        # callback, which stays alive as long as the module
        M.mtmd_log_set(_logger.llama_log_callback, None)
        M.mtmd_helper_log_set(_logger.llama_log_callback, None)
        self.path = mmproj
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.warmup = False
        params.n_threads = n_threads or max(multiprocessing.cpu_count() // 2, 1)
        ctx = M.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not ctx:
            raise ValueError(f"{mmproj.name} is not a projector llama.cpp can load for this model (its log says why)")
        self.ctx = ctx
        try:
            if not M.mtmd_support_vision(ctx):
                raise ValueError(f"{mmproj.name} reads no images (an audio projector?)")
            if M.mtmd_decode_use_mrope(ctx):
                raise ValueError(f"{mmproj.name} places image tokens on 2-D positions (M-RoPE), which this server's "
                                 "batch does not do yet: serve this model through llama-server (--upstream-url)")
        except BaseException:
            M.mtmd_free(ctx)
            raise
        # tokenizing (the prepare thread, generation threads) and evaluating (the batch's thread)
        # share the projector's context
        self.lock = threading.Lock()

    def _chunks(self, text: str, images: list[Image]) -> tuple[Any, list[int]]:
        M = self.M
        bitmaps, ids = [], []
        try:
            for image in images:
                nx, ny, data = rgb(image)
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                bitmap = M.mtmd_bitmap_init(nx, ny, buf)
                if not bitmap:
                    raise ValueError("the projector could not take an image")
                bitmaps.append(bitmap)
                ids.append(image_id(data))
            chunks = M.mtmd_input_chunks_init()
            encoded = text.encode("utf-8")
            given = M.mtmd_input_text(encoded, len(encoded), True, True)
            array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self.lock:
                rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(given), array, len(bitmaps))
            if rc != 0:
                M.mtmd_input_chunks_free(chunks)
                raise ValueError(f"the prompt's {len(bitmaps)} image(s) do not match its {text.count(MARKER)} "
                                 f"{MARKER} placeholder(s)" if rc in (1, 2) else
                                 f"the projector failed on an image ({rc})")
            return chunks, ids
        finally:
            for bitmap in bitmaps:
                M.mtmd_bitmap_free(bitmap)

    def media(self, text: str, images: list[Any]) -> Media:
        """The prompt as chunks, with its token ids (images as runs of their ids)."""
        M = self.M
        chunks, ids = self._chunks(text, images)
        media = Media(self, chunks)
        images_seen = 0
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                media.tokens.extend(ptr[k] for k in range(n.value))
            else:
                count = M.mtmd_input_chunk_get_n_tokens(chunk)
                media.runs[len(media.tokens)] = (chunk, count)
                media.tokens.extend([ids[images_seen]] * count)
                images_seen += 1
        return media

    def tokens(self, text: str, images: list[Any]) -> list[int]:
        media = self.media(text, images)
        media.close()
        return media.tokens

    def evaluate(self, lctx: Any, chunk: Any, n_past: int, seq_id: int, n_batch: int) -> int:
        """Encodes the image of ``chunk`` and decodes its embeddings into sequence ``seq_id`` from
        position ``n_past``; the position after it. On the batch's thread."""
        M = self.M
        new_n_past = self._pos(n_past)
        with self.lock:
            rc = M.mtmd_helper_eval_chunk_single(self.ctx, lctx, chunk, n_past, seq_id, n_batch, False,
                                                 ctypes.byref(new_n_past))
        if rc != 0:
            raise RuntimeError(f"llama.cpp could not read an image into the context ({rc})")
        return int(new_n_past.value)

    @staticmethod
    def _pos(value: int) -> Any:
        from llama_cpp import llama_pos

        return llama_pos(value)

    def close(self) -> None:
        if self.ctx:
            self.M.mtmd_free(self.ctx)
            self.ctx = None


def image_at(work: Any) -> tuple[Any, int] | None:
    """The image (chunk, token count) a sequence's prompt has reached, if any."""
    return work.media.run_at(work.n_past) if work.media is not None else None


def to_image(work: Any) -> int:
    """Prompt tokens a sequence may read before its next image (an image is read on its own)."""
    start = work.media.next_run(work.n_past) if work.media is not None else None
    return start - work.n_past if start is not None else work.end() - work.n_past
