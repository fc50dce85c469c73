"""Test double of modules.presets: the host's presets folder."""

# As the host's files: only the samplers a preset changes.
PRESETS = {"Deterministic": {"temperature": 1, "top_k": 1, "do_sample": False},
           "Creative": {"temperature": 1.3, "top_p": 0.98, "min_p": 0.05, "repetition_penalty": 1.05}}


def default_preset():
    return {"temperature": 1, "top_p": 1, "top_k": 0, "min_p": 0, "typical_p": 1, "repetition_penalty": 1,
            "presence_penalty": 0, "frequency_penalty": 0, "do_sample": True}


def load_preset_memoized(name):
    """As the host's: the default preset with the file's values over it."""
    return {**default_preset(), **PRESETS.get(name, {})}
