"""Test double of modules.models_settings: a model's own loader settings (from its metadata and
the host's per-model settings file), applied to shared.args before it is loaded."""

from . import shared

ALPACA = ("{%- for message in messages %}{%- if message['role'] == 'user' %}{{ '### Instruction:\n' + "
          "message['content'] + '\n\n' }}{%- elif message['role'] == 'assistant' %}{{ '### Response:\n' + "
          "message['content'] + '\n\n' }}{%- else %}{{ message['content'] + '\n\n' }}{%- endif %}{%- endfor %}"
          "{%- if add_generation_prompt %}{{ '### Response:\n' }}{%- endif %}")
# As the host reads them from a GGUF and its per-model settings: the loader, its settings, and
# the model's own instruction template.
METADATA = {"Other-Model-3B-Instruct.Q5_K_M.gguf": {"loader": "llama.cpp", "ctx_size": 8192, "gpu_layers": 33,
                                                     "instruction_template_str": ALPACA}}
CALLS = []   # model names get_model_metadata was asked for


def get_model_metadata(model):
    CALLS.append(model)
    return dict(METADATA.get(model, {"loader": "llama.cpp"}))


def update_model_parameters(state, initial=False):
    for key, value in state.items():
        if hasattr(shared.args, key):
            setattr(shared.args, key, value)
