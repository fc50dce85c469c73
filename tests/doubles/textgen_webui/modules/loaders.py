"""Test double of modules.loaders: the loader settings the host's Model tab offers, and the
samplers each loader applies."""


def list_model_elements():
    # The names of shared.args entries that the Model tab shows (a subset of the real list).
    return ["filter_by_loader", "loader", "cpu_memory", "gpu_layers", "threads", "threads_batch", "batch_size",
            "ctx_size", "cache_type", "tensor_split", "extra_flags", "gpu_split", "load_in_8bit", "load_in_4bit",
            "cpu", "no_mmap", "mlock", "numa"]


# The generation settings each loader applies, as the host's table has them for these two
# loaders; a loader ignores every other sampler of the state.
loaders_samplers = {
    "Transformers": {
        "temperature", "dynatemp_low", "dynatemp_high", "dynatemp_exponent", "smoothing_factor",
        "smoothing_curve", "min_p", "top_p", "top_k", "typical_p", "xtc_threshold", "xtc_probability",
        "epsilon_cutoff", "eta_cutoff", "tfs", "top_a", "top_n_sigma", "adaptive_target", "adaptive_decay",
        "dry_multiplier", "dry_allowed_length", "dry_base", "repetition_penalty", "frequency_penalty",
        "presence_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "repetition_penalty_range",
        "penalty_alpha", "guidance_scale", "mirostat_mode", "mirostat_tau", "mirostat_eta",
        "prompt_lookup_num_tokens", "do_sample", "dynamic_temperature", "temperature_last",
        "auto_max_new_tokens", "ban_eos_token", "add_bos_token", "skip_special_tokens", "static_cache", "seed",
        "sampler_priority", "custom_token_bans", "negative_prompt", "dry_sequence_breakers", "grammar_string",
        "grammar_file_row",
    },
    "llama.cpp": {
        "temperature", "dynatemp_low", "dynatemp_high", "dynatemp_exponent", "min_p", "top_p", "top_k",
        "typical_p", "xtc_threshold", "xtc_probability", "top_n_sigma", "adaptive_target", "adaptive_decay",
        "dry_multiplier", "dry_allowed_length", "dry_base", "repetition_penalty", "frequency_penalty",
        "presence_penalty", "repetition_penalty_range", "mirostat_mode", "mirostat_tau", "mirostat_eta",
        "dynamic_temperature", "temperature_last", "auto_max_new_tokens", "ban_eos_token", "add_bos_token",
        "seed", "sampler_priority", "custom_token_bans", "dry_sequence_breakers", "grammar_string",
        "grammar_file_row",
    },
}
