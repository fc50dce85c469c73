"""Test double of modules.LoRA."""

from . import shared


def add_lora_to_model(lora_names):
    shared.lora_names = list(lora_names)
