"""Test double of modules.utils: what the host finds in its models and loras folders."""

# As the host lists them: GGUF files by their path under the models folder (a subfolder's with
# "/"), then model folders.
AVAILABLE_MODELS = ["Double-Model-1B-Instruct.Q4_K_M.gguf", "Other-Model-3B-Instruct.Q5_K_M.gguf",
                    "Qwen2.5-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf"]
AVAILABLE_LORAS = ["style-lora", "facts-lora"]


def get_available_models():
    return list(AVAILABLE_MODELS)


def get_available_loras():
    return ["None"] + sorted(AVAILABLE_LORAS)


def get_available_presets():
    from . import presets

    return sorted(presets.PRESETS)


def get_available_characters():
    from . import chat

    return sorted(chat.CHARACTERS)


def get_available_instruction_templates():
    from . import chat

    return ["None"] + sorted(chat.INSTRUCTION_TEMPLATES)
