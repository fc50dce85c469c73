"""Test double of modules.utils: what the host finds in its models and loras folders."""

AVAILABLE_MODELS = ["Double-Model-1B-Instruct.Q4_K_M.gguf", "Other-Model-3B-Instruct.Q5_K_M.gguf"]
AVAILABLE_LORAS = ["style-lora", "facts-lora"]


def get_available_models():
    return list(AVAILABLE_MODELS)


def get_available_loras():
    return ["None"] + sorted(AVAILABLE_LORAS)
