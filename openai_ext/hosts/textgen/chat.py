"""The web UI's chat side: OpenAI messages as its chat history, and the request's chat mode,
character, templates and preset resolved with the web UI's own loaders (as its API does)."""

from __future__ import annotations

import copy
from typing import Any

from ...core.errors import InvalidRequestError
from ..request import ChatOptions


def messages_to_history(messages: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """Converts OpenAI messages into the web UI's chat history.

    Returns (user_input, leading system text, history). Leading system messages become the
    host's ``custom_system_message``; later ones keep their place as system rows, so no system
    message is dropped. ``user_input`` is the last user message when nothing answered it yet.
    """
    system: list[str] = []
    rows: list[list[Any]] = []
    pending: str | None = None
    started = False

    def flush_user():
        nonlocal pending
        if pending is not None:
            rows.append([pending, "", "", {}])
            pending = None

    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "system" and not started:
            system.append(content)
            continue
        started = True
        if role == "system":
            flush_user()
            rows.append([content, "", "", {"role": "system"}])
        elif role == "user":
            flush_user()
            pending = content
        elif role == "assistant":
            meta = {"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {}
            rows.append([pending or "", content, "", meta])
            pending = None
        elif role == "tool":
            flush_user()
            rows.append(["", "", content, {"tool_call_id": m.get("tool_call_id")} if m.get("tool_call_id") else {}])
    history = {"internal": rows, "visible": copy.deepcopy(rows), "metadata": {}}
    return pending or "", "\n".join(system), history


def _available(m: Any, what: str, name: str, param: str) -> None:
    """Names are taken only as the web UI lists them (never as paths)."""
    lister = getattr(m.utils, f"get_available_{what}", None)
    names = [n for n in (lister() if lister else []) if n != "None"]
    if name not in names:
        shown = ", ".join(names[:20]) if names else "none"
        raise InvalidRequestError(f"{param} {name!r} is not one the web UI has. Available: {shown}.", param=param)


def resolve_preset(m: Any, name: str) -> dict[str, Any]:
    """A preset's sampler settings, by the name the web UI lists it by."""
    _available(m, "presets", name, "preset")
    import importlib

    return dict(importlib.import_module("modules.presets").load_preset_memoized(name))


def resolve_chat(m: Any, options: ChatOptions) -> dict[str, Any]:
    """The state keys of the request's chat mode, character and templates, as the web UI's own
    API fills them (modules/api/completions.py): a named instruction template or one given
    inline; in chat modes the character (the web UI's default one unless named), with the
    request's names, context and greeting over it."""
    shared = m.shared
    defaults = getattr(shared, "default_settings", shared.settings)
    out: dict[str, Any] = {}
    if options.instruction_template_str:
        out["instruction_template_str"] = options.instruction_template_str
    elif options.instruction_template:
        _available(m, "instruction_templates", options.instruction_template, "instruction_template")
        out["instruction_template_str"] = m.chat.load_instruction_template_memoized(options.instruction_template)
    if options.mode != "instruct" or options.character:
        character = options.character or defaults.get("character") or "Assistant"
        if options.character:
            _available(m, "characters", character, "character")
        name1 = options.name1 or defaults.get("name1", "You")
        name1, name2, _, greeting, context = m.chat.load_character_memoized(character, name1, "")
        out.update(name1=name1, name2=options.name2 or name2, context=options.context or context,
                   greeting=options.greeting or greeting, character=character)
    for key in ("name1", "name2", "context", "greeting", "user_bio"):
        if getattr(options, key) and key not in out:
            out[key] = getattr(options, key)
    out["chat_template_str"] = options.chat_template_str or defaults.get("chat_template_str", "")
    command = options.chat_instruct_command or defaults.get("chat-instruct_command")
    if command:
        out["chat-instruct_command"] = command
    return out
