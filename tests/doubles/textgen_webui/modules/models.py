"""Test double of modules.models: the host's model loader, and its model classes (the host
tells loaders apart by their class names)."""

import threading
from types import SimpleNamespace

from . import shared

LOADS = []   # model names load_model was asked for
# Names whose loader fails. As the host's: load_model sets model_name first, and a loader that
# fails logs why and gives (None, None); RAISES maps a name to the exception its loader raises.
BROKEN = set()
RAISES = {}
active_generation_count = 0
_generation_count_lock = threading.Lock()


class DoubleForCausalLM:
    """A Transformers model: called on input ids, it gives logits for every position."""

    device = "cpu"

    def __call__(self, input_ids=None, **kwargs):
        from . import text_generation

        return SimpleNamespace(logits=text_generation.prompt_logits(input_ids[0].tolist()))

    forward = __call__


class DoubleHFTokenizer:
    bos_token_id = 256
    eos_token_id = 257

    def decode(self, ids, skip_special_tokens=True):
        from . import text_generation

        return text_generation.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, tid):
        """A byte-level BPE vocabulary entry (GPT-2's printable alphabet for bytes)."""
        from . import text_generation

        return "".join(BYTE_LEVEL[b] for b in text_generation.token_bytes(tid))


def _byte_level():
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


BYTE_LEVEL = _byte_level()


def new_model(loader):
    """(model, tokenizer) as the loader gives them."""
    from . import text_generation

    if loader == "llama.cpp":
        model = text_generation.LlamaServer()
        return model, model
    if loader == "ExLlamav3":
        return text_generation.Exllamav3Model(), DoubleHFTokenizer()
    if loader == "TensorRT-LLM":
        return text_generation.TensorRTLLMModel(), DoubleHFTokenizer()
    return DoubleForCausalLM(), DoubleHFTokenizer()


def load_model(model_name, loader=None):
    from . import models_settings

    LOADS.append(model_name)
    shared.model_name = model_name
    metadata = models_settings.get_model_metadata(model_name)
    loader = loader or shared.args.loader or metadata["loader"]
    shared.args.loader = loader
    if model_name in RAISES:
        raise RAISES[model_name]
    if model_name in BROKEN:
        return None, None
    model, tokenizer = new_model(loader)
    # as the host's: the model's metadata (its template, say) updates the settings, and on
    # llama.cpp the context length follows ctx_size
    shared.settings.update({k: v for k, v in metadata.items() if k in shared.settings})
    if loader == "llama.cpp" and shared.args.ctx_size > 0:
        shared.settings["truncation_length"] = shared.args.ctx_size
    shared.is_multimodal = False
    if loader.lower() in ("exllamav3", "llama.cpp") and hasattr(model, "is_multimodal"):
        shared.is_multimodal = model.is_multimodal()
    return model, tokenizer


def load_model_if_idle_unloaded():
    # As the host's: with --idle-timeout an idle model is unloaded but keeps its name (see
    # unload_model(keep_model_name=True)); generate_reply, encode and decode call this first.
    if shared.args.idle_timeout > 0 and shared.model is None and shared.model_name not in [None, "None"]:
        shared.model, shared.tokenizer = load_model(shared.model_name)


def unload_model(keep_model_name=False):
    if shared.model is None:   # as the host's: nothing loaded, nothing changes (model_name neither)
        return
    shared.model = shared.tokenizer = None
    shared.lora_names = []
    if not keep_model_name:
        shared.model_name = "None"
