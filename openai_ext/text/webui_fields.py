"""The web UI's own request fields, as this project's extensions to OpenAI's schema.

Clients written for the web UI's built-in API send its chat modes, characters, instruction
templates, presets and reasoning switches as extra fields. In extension mode they mean what
they mean there; the embedded host of standalone mode has no characters, templates or presets
to load, so a field that would change the answer gets a 400 naming it there, and one that would
not is ignored. ``params.plan`` applies them; this module reads and checks them.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import InvalidRequestError
from ..hosts.base import HostAbilities

MODES = ("instruct", "chat", "chat-instruct")

# Fields that shape the prompt (the host renders them with its chat template), by type. The
# web UI's API takes user_name and bot_name for name1 and name2; both spellings are accepted.
TEMPLATE_FIELDS: dict[str, type] = {
    "mode": str, "character": str, "instruction_template": str, "instruction_template_str": str,
    "chat_template_str": str, "name1": str, "name2": str, "context": str, "greeting": str, "user_bio": str,
    "chat_instruct_command": str, "continue_": bool,
}
ALIASES = {"user_name": "name1", "bot_name": "name2"}
# Reasoning switches the model's chat template reads (Qwen3, gpt-oss, ...).
REASONING_FIELDS: dict[str, type] = {"enable_thinking": bool}
# Generation fields of the web UI's API with a meaning only there.
GENERATION_FIELDS: dict[str, type] = {"preset": str, "max_tokens_second": int, "grammar_string": str}
# Fields the server decides itself (it fits max_tokens to the context): accepted and ignored.
IGNORED = {"truncation_length", "auto_max_new_tokens"}

# OpenAI's reasoning_effort values, as the web UI's templates take them.
EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}

ALL = {*TEMPLATE_FIELDS, *ALIASES, *REASONING_FIELDS, *GENERATION_FIELDS, *IGNORED}


def _checked(name: str, value: Any, kind: type) -> Any:
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, int) and not isinstance(value, bool) if kind is int else isinstance(value, str))
    if not ok:
        what = "a boolean" if kind is bool else "an integer" if kind is int else "a string"
        raise InvalidRequestError(f"{name} must be {what}.", param=name)
    return value


def _default(key: str, value: Any) -> bool:
    """A value that asks for what a host without the web UI does anyway: instruct mode (the
    model's own template), no continuation, nothing named."""
    return value in (None, "", False, "None") or (key == "mode" and value == "instruct")


def _not_here(name: str) -> InvalidRequestError:
    return InvalidRequestError(f"{name} is a field of text-generation-webui's API (its chat modes, characters, "
                               "templates and presets); this server runs without the web UI, so it cannot apply "
                               f"it. Remove {name}, or run this server as a web UI extension.", param=name)


def template_settings(extra: dict[str, Any], abilities: HostAbilities, *, chat: bool,
                      reasoning_effort: str | None = None) -> dict[str, Any]:
    """The settings the host's prompt builder takes from the request's extra fields."""
    out: dict[str, Any] = {}
    for name, value in extra.items():
        key = ALIASES.get(name, name)
        if key in TEMPLATE_FIELDS:
            if not chat:
                continue   # params.plan names it as a chat field
            if not abilities.web_ui:
                if _default(key, value):
                    continue   # what this host does anyway (clients of the web UI's API send these)
                raise _not_here(name)
            out[key] = _checked(name, value, TEMPLATE_FIELDS[key])
        elif key in REASONING_FIELDS and abilities.web_ui and chat:
            out[key] = _checked(name, value, REASONING_FIELDS[key])
    if out.get("mode", "instruct") not in MODES:
        raise InvalidRequestError(f"mode {out['mode']!r} is not one of {', '.join(MODES)}.", param="mode")
    if reasoning_effort is not None and abilities.web_ui:
        effort = reasoning_effort.lower()
        if effort == "none":
            out["enable_thinking"] = False
        elif effort in EFFORTS:
            out["reasoning_effort"] = EFFORTS[effort]
        else:
            raise InvalidRequestError(f"reasoning_effort {reasoning_effort!r} is not one of none, minimal, low, "
                                      "medium, high, xhigh.", param="reasoning_effort")
    return out


def generation_settings(extra: dict[str, Any], abilities: HostAbilities) -> dict[str, Any]:
    """The web UI's generation fields (preset, max_tokens_second) as host settings."""
    out: dict[str, Any] = {}
    grammar = extra.get("grammar_string")
    if grammar:
        # A GBNF grammar the output must follow, in both modes (the host checks that it parses).
        if not abilities.grammar:
            raise InvalidRequestError("grammar_string needs a backend that constrains output with a grammar, and "
                                      "the loaded model's cannot; remove it.", param="grammar_string")
        out["grammar_string"] = _checked("grammar_string", grammar, str)
    for name, kind in GENERATION_FIELDS.items():
        if name == "grammar_string":
            continue
        if name in extra and not _default(name, extra[name]):
            if not abilities.web_ui:
                if name == "preset":
                    raise _not_here(name)
                continue   # max_tokens_second only slows the web UI's output down
            out[name] = _checked(name, extra[name], kind)
    return out
