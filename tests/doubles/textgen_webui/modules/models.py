"""Test double of modules.models: the host's model loader."""

from . import shared

LOADS = []   # model names load_model was asked for


def load_model(model_name, loader=None):
    LOADS.append(model_name)
    shared.model_name = model_name
    return object(), object()   # (model, tokenizer)


def unload_model(keep_model_name=False):
    shared.model = shared.tokenizer = None
    shared.lora_names = []
    if not keep_model_name:
        shared.model_name = "None"
