"""Test double of modules.models_settings: a model's own loader settings (from its metadata and
the host's per-model settings file), applied to shared.args before it is loaded."""

from . import shared

METADATA = {"Other-Model-3B-Instruct.Q5_K_M.gguf": {"loader": "llama.cpp", "ctx_size": 8192, "gpu_layers": 33}}
CALLS = []   # model names get_model_metadata was asked for


def get_model_metadata(model):
    CALLS.append(model)
    return dict(METADATA.get(model, {"loader": "llama.cpp"}))


def update_model_parameters(state, initial=False):
    for key, value in state.items():
        if hasattr(shared.args, key):
            setattr(shared.args, key, value)
