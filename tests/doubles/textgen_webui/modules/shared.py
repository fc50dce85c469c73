"""Test double of modules.shared: the host's global state."""

import argparse
import copy
import threading

model = tokenizer = None  # set below: the llama.cpp loader's model, which is its own tokenizer
model_name = "Double-Model-1B-Instruct.Q4_K_M.gguf"
lora_names = []
stop_everything = False
generation_lock = threading.Lock()   # the real one is a plain Lock, not reentrant
is_multimodal = False   # as the host's: set by models.load_model from the model's is_multimodal()
# The Image tab's model: a diffusers pipeline (ui_image_generation.py's double: ImagePipeline)
image_model = None
image_model_name = 'None'
image_pipeline_type = None

args = argparse.Namespace(loader="llama.cpp", listen=False, listen_host=None, api_key="", admin_key="",
                          public_api=False, verbose=False, model_dir="user_data/models", lora_dir="user_data/loras",
                          ctx_size=4096, gpu_layers=0, threads=0, extra_flags=None, trust_remote_code=False,
                          idle_timeout=0, parallel=1, nowebui=False, api=False, public_api_id=None, mmproj=None)
original_args = argparse.Namespace(**vars(args))   # the startup values, as the host keeps them

CHATML = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)

# The host's default template of chat mode (modules/shared.py)
CHAT_MODE = (
    "{%- for message in messages %}\n    {%- if message['role'] == 'system' -%}\n        {%- if message['content'] -%}\n"
    "            {{- message['content'] + '\\n\\n' -}}\n        {%- endif -%}\n        {%- if user_bio -%}\n"
    "            {{- user_bio + '\\n\\n' -}}\n        {%- endif -%}\n    {%- elif message['role'] == 'tool' -%}\n"
    "        {{- '[Tool result: ' + message['content'] + ']\\n' -}}\n    {%- elif message['role'] == 'user' -%}\n"
    "        {{- name1 + ': ' + message['content'] + '\\n'-}}\n    {%- else -%}\n"
    "        {{- name2 + ': ' + message['content'] + '\\n' -}}\n    {%- endif -%}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt %}\n    {{- name2 + ':' -}}\n{%- endif %}"
)

# The real dict has ~100 keys; these are the ones generation reads, with the host's defaults.
settings = {
    "mode": "instruct", "max_new_tokens": 512, "auto_max_new_tokens": True, "ban_eos_token": False,
    "add_bos_token": True, "skip_special_tokens": True, "stream": True, "truncation_length": 4096,
    "seed": -1, "custom_stopping_strings": "", "custom_token_bans": "", "negative_prompt": "",
    "temperature": 0.6, "dynatemp_low": 1, "dynatemp_high": 1, "dynatemp_exponent": 1,
    "smoothing_factor": 0, "smoothing_curve": 1, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
    "top_n_sigma": 0, "typical_p": 1, "xtc_threshold": 0.1, "xtc_probability": 0, "epsilon_cutoff": 0,
    "eta_cutoff": 0, "tfs": 1, "top_a": 0, "dry_multiplier": 0, "dry_allowed_length": 2, "dry_base": 1.75,
    "repetition_penalty": 1.15, "frequency_penalty": 0, "presence_penalty": 0,
    "encoder_repetition_penalty": 1, "no_repeat_ngram_size": 0, "repetition_penalty_range": 1024,
    "penalty_alpha": 0, "guidance_scale": 1, "mirostat_mode": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
    "do_sample": True, "dynamic_temperature": False, "temperature_last": False, "grammar_string": "",
    "max_tokens_second": 0, "name1": "You", "name2": "AI", "user_bio": "", "context": "",
    "custom_system_message": "", "instruction_template_str": CHATML, "chat_template_str": CHAT_MODE,
    "enable_thinking": True, "reasoning_effort": "medium", "character": "Assistant", "preset": None,
    "chat-instruct_command": "Continue the chat dialogue below. Write a single reply for the character "
                             "\"<|character|>\".\n\n<|prompt|>",
    "sampler_priority": "", "dry_sequence_breakers": '"\\n", ":", "\\"", "*"', "static_cache": False,
    "prompt_lookup_num_tokens": 0, "adaptive_target": 0, "adaptive_decay": 0.9,
    # the Image tab's settings, with the host's defaults
    "image_prompt": "", "image_neg_prompt": "", "image_width": 1024, "image_height": 1024,
    "image_aspect_ratio": "1:1 Square", "image_steps": 9, "image_cfg_scale": 0.0, "image_seed": -1,
    "image_batch_size": 1, "image_batch_count": 1, "image_llm_variations": False, "image_model_menu": "None",
    "image_dtype": "bfloat16", "image_attn_backend": "sdpa", "image_cpu_offload": False, "image_compile": False,
    "image_quant": "none",
}
default_settings = copy.deepcopy(settings)
bos_token, eos_token = "<s>", "</s>"

from .text_generation import LlamaServer  # noqa: E402  (after the settings it reads)

model = tokenizer = LlamaServer()
