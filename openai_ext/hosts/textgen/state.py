"""The hosts' typed request in the web UI's vocabulary: the state dict its generation functions
and prompt builder read. Only hosts/textgen* speak it."""

from __future__ import annotations

import copy
from typing import Any

from ..request import ChatOptions, GenerationSettings
from .chat import resolve_preset


def generation_state(g: GenerationSettings) -> dict[str, Any]:
    """The generation settings by the web UI's names. A sampler left to the preset (None) is
    left out, so the preset's value stays."""
    out: dict[str, Any] = {"auto_max_new_tokens": False, "stream": True, "max_new_tokens": g.max_new_tokens}
    if g.temperature is not None:
        out["temperature"] = g.temperature
        out["do_sample"] = g.temperature > 0
    if g.greedy:
        out["top_k"] = 1   # (a top_k the request names still wins: samplers come last)
    for name in ("top_p", "presence_penalty", "frequency_penalty"):
        value = getattr(g, name)
        if value is not None:
            out[name] = value
    out["seed"] = -1 if g.seed is None else g.seed
    if g.logit_bias:
        out["logit_bias"] = {str(token): bias for token, bias in g.logit_bias.items()}
    if g.logprobs is not None:
        out["logprobs"] = g.logprobs
    if g.grammar:
        out["grammar_string"] = g.grammar
    if g.preset:
        out["preset"] = g.preset
    if g.max_tokens_second is not None:
        out["max_tokens_second"] = g.max_tokens_second
    out.update(g.samplers)
    return out


def request_state(m: Any, settings: GenerationSettings | None = None,
                  options: ChatOptions | None = None) -> dict[str, Any]:
    """The state for one request. Missing keys make the host's loaders fail silently, so it
    starts from all of the web UI's settings; a preset's samplers come next, then the request's
    own. The mode is the API's default (instruct) unless the request names one, whatever the
    UI's is."""
    state = copy.deepcopy(m.shared.settings)
    if settings is not None:
        if settings.preset:
            state.update(resolve_preset(m, settings.preset))
        state.update(generation_state(settings))
    if options is not None:
        if options.tools:
            state["tools"] = options.tools
        state.update(options.web_ui_fields())
    state["mode"] = options.mode if options is not None else "instruct"
    return state
