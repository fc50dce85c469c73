"""The upstream host's own samplers, typed: which of a request's samplers each kind of engine
takes, and the request fields they become there.

A request's ``samplers`` (GenerationSettings) are read once into ``Options`` (a name no engine
takes is refused: params.plan answers 400 before it gets here, naming the samplers the engine
has, which are ``TAKES[dialect]``). Each engine's fields are then written from the typed options
by a function of their own, so a misspelt sampler fails the type check, not a request.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from ..request import GenerationSettings


class Options(BaseModel):
    """The samplers some engine takes; None: the request does not name it (the engine's default)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    repetition_penalty: float | None = None
    repetition_penalty_range: int | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    mirostat_mode: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    ban_eos_token: bool | None = None

    @classmethod
    def of(cls, settings: GenerationSettings) -> "Options":
        return cls.model_validate(dict(settings.samplers))


def _named(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _llama_cpp(o: Options) -> dict[str, Any]:
    return _named(top_k=o.top_k, min_p=o.min_p, typical_p=o.typical_p, top_n_sigma=o.top_n_sigma,
                  repeat_penalty=o.repetition_penalty, repeat_last_n=o.repetition_penalty_range,
                  xtc_threshold=o.xtc_threshold, xtc_probability=o.xtc_probability,
                  dry_multiplier=o.dry_multiplier, dry_base=o.dry_base, dry_allowed_length=o.dry_allowed_length,
                  mirostat=o.mirostat_mode, mirostat_tau=o.mirostat_tau, mirostat_eta=o.mirostat_eta,
                  ignore_eos=o.ban_eos_token)


def _vllm(o: Options) -> dict[str, Any]:
    return _named(top_k=o.top_k, min_p=o.min_p, repetition_penalty=o.repetition_penalty, ignore_eos=o.ban_eos_token)


def _openai_ext(o: Options) -> dict[str, Any]:
    """Another instance of this server: its own names."""
    return _named(top_k=o.top_k, min_p=o.min_p, typical_p=o.typical_p, repetition_penalty=o.repetition_penalty,
                  ban_eos_token=o.ban_eos_token)


# Each kind of engine: the samplers it takes (ours), and how they are written in its request.
TAKES: dict[str, frozenset[str]] = {
    "llama.cpp": frozenset({"top_k", "min_p", "typical_p", "top_n_sigma", "repetition_penalty",
                            "repetition_penalty_range", "xtc_threshold", "xtc_probability", "dry_multiplier",
                            "dry_base", "dry_allowed_length", "mirostat_mode", "mirostat_tau", "mirostat_eta",
                            "ban_eos_token"}),
    "vllm": frozenset({"top_k", "min_p", "repetition_penalty", "ban_eos_token"}),
    "openai_ext": frozenset({"top_k", "min_p", "typical_p", "repetition_penalty", "ban_eos_token"}),
    "generic": frozenset(),
}
_WRITERS: dict[str, Callable[[Options], dict[str, Any]]] = {
    "llama.cpp": _llama_cpp, "vllm": _vllm, "openai_ext": _openai_ext, "generic": lambda o: {}}


def takes(dialect: str | None) -> frozenset[str]:
    """The samplers an engine of this kind takes (none for an engine not yet known)."""
    return TAKES.get(dialect or "", frozenset())


def engine_fields(dialect: str, settings: GenerationSettings) -> dict[str, Any]:
    """The engine's request fields for the samplers the request names."""
    writer = _WRITERS.get(dialect)
    return writer(Options.of(settings)) if writer is not None else {}
