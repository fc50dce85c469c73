"""Test double of modules.LoRA.

As the host's: LoRAs are applied with PEFT, which needs a Transformers model. On a model of
another loader (llama.cpp's server, say) it fails the way the host's does, with an
AttributeError; a LoRA whose files are damaged fails with the adapter's path in the message."""

from pathlib import Path

from . import shared

BROKEN = set()   # LoRA names whose adapter files cannot be read
CALLS = []       # the name lists add_lora_to_model was given


def add_lora_to_model(lora_names):
    CALLS.append(list(lora_names))
    if set(lora_names) == set(shared.lora_names):
        return   # nothing to add or remove
    if lora_names:
        if shared.model is None:
            raise AttributeError("'NoneType' object has no attribute 'dtype'")
        if shared.args.loader != "Transformers":
            raise AttributeError("'LlamaServer' object has no attribute 'dtype'")
        for name in lora_names:
            if name in BROKEN:
                folder = Path(shared.args.lora_dir).resolve() / name
                raise ValueError(f"Can't find 'adapter_config.json' at '{folder}'")
    shared.lora_names = list(lora_names)
