"""Test double of modules.models: the host's model loader."""

from . import shared

LOADS = []   # model names load_model was asked for
# Names whose loader fails. As the host's: load_model sets model_name first, and a loader that
# fails logs why and gives (None, None); RAISES maps a name to the exception its loader raises.
BROKEN = set()
RAISES = {}


def load_model(model_name, loader=None):
    LOADS.append(model_name)
    shared.model_name = model_name
    if model_name in RAISES:
        raise RAISES[model_name]
    if model_name in BROKEN:
        return None, None
    return object(), object()   # (model, tokenizer)


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
