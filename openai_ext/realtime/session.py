"""A realtime session's settings: what ``session.update`` may set, checked field by field with a
message that says what to change, and the ``session`` object that ``session.created`` and
``session.updated`` carry (OpenAI's ``RealtimeSessionCreateResponseGA``).

The defaults are OpenAI's: audio out, server_vad turn detection, 24 kHz PCM both ways. Input is
always transcribed here (the text model hears the transcript), so input transcription is on
unless the session turns it off; off, the transcription events are not sent.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..core.api_model import ApiModel
from ..core.errors import InvalidRequestError
from .audio import FORMATS, VadSettings
from .events import ClientEventError
from .events import field as get

MODALITIES = ("text", "audio")
MAX_INSTRUCTIONS = 32_768
MAX_TOOLS = 128
MAX_OUTPUT_TOKENS = 4096
SPEEDS = (0.25, 1.5)
# semantic_vad is served by the same detector, waiting for a silence as long as its eagerness says
# (there is no model here that hears whether a sentence is finished)
EAGERNESS_SILENCE_MS = {"low": 1200, "medium": 700, "auto": 700, "high": 350}
DEFAULT_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
               "create_response": True, "interrupt_response": True, "idle_timeout_ms": None}


@dataclass
class SessionConfig:
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    voice: str = "alloy"
    speed: float = 1.0
    transcription: dict[str, Any] | None = field(default_factory=lambda: {"model": "whisper-1"})
    turn_detection: dict[str, Any] | None = field(default_factory=lambda: dict(DEFAULT_VAD))
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    max_output_tokens: int | str = "inf"
    temperature: float | None = None

    @property
    def vad(self) -> VadSettings | None:
        td = self.turn_detection
        if td is None:
            return None
        if td["type"] == "semantic_vad":
            return VadSettings(silence_duration_ms=EAGERNESS_SILENCE_MS[td["eagerness"]])
        return VadSettings(td["threshold"], td["prefix_padding_ms"], td["silence_duration_ms"])

    def copy(self) -> "SessionConfig":
        return copy.deepcopy(self)


def _format(value: Any, param: str) -> str:
    if not isinstance(value, dict) or value.get("type") not in FORMATS:
        raise ClientEventError(f"'{param}' must be an object with type one of {', '.join(FORMATS)} "
                               '(for example {"type": "audio/pcm", "rate": 24000}).', param=param)
    if value["type"] == "audio/pcm" and value.get("rate", 24000) != 24000:
        raise ClientEventError(f"'{param}.rate' must be 24000: audio/pcm is 16-bit mono at 24 kHz.",
                               param=f"{param}.rate")
    return value["type"]


def _turn_detection(value: Any, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("server_vad", "semantic_vad"):
        kind = value.get("type") if isinstance(value, dict) else value
        raise ClientEventError(f"'{param}' must be null (push-to-talk: commit the buffer yourself), "
                               f"{{\"type\": \"server_vad\", ...}} or {{\"type\": \"semantic_vad\", ...}}; not "
                               f"{kind!r}.", param=param)
    if value["type"] == "semantic_vad":
        eagerness = value.get("eagerness", "auto")
        if eagerness not in EAGERNESS_SILENCE_MS:
            raise ClientEventError(f"'{param}.eagerness' must be one of {', '.join(EAGERNESS_SILENCE_MS)}.",
                                   param=f"{param}.eagerness")
        semantic = {"type": "semantic_vad", "eagerness": eagerness, "create_response": True,
                    "interrupt_response": True}
        _flags(value, semantic, param)
        return semantic
    out = dict(DEFAULT_VAD)
    threshold = get(value, "threshold", (int, float), where=param)
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ClientEventError(f"'{param}.threshold' must be from 0.0 to 1.0.", param=f"{param}.threshold")
        out["threshold"] = float(threshold)
    for name, low, high in (("prefix_padding_ms", 0, 10_000), ("silence_duration_ms", 32, 10_000)):
        ms = get(value, name, int, where=param)
        if ms is not None:
            if not low <= ms <= high:
                raise ClientEventError(f"'{param}.{name}' must be from {low} to {high}.", param=f"{param}.{name}")
            out[name] = ms
    _flags(value, out, param)
    return out


def _flags(value: dict[str, Any], out: dict[str, Any], param: str) -> None:
    for name in ("create_response", "interrupt_response"):
        flag = get(value, name, bool, where=param)
        if flag is not None:
            out[name] = flag


def check_tools(value: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ClientEventError(f"'{param}' must be a list of at most {MAX_TOOLS} function tools.", param=param)
    for i, tool in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ClientEventError(f"'{where}' must be a function tool: {{\"type\": \"function\", \"name\": ..., "
                                   "\"parameters\": {...}} (MCP tools are not available here).", param=where)
        get(tool, "name", str, required=True, where=where)
        get(tool, "description", str, where=where)
        get(tool, "parameters", dict, where=where)
    return [dict(t, type="function") for t in value]


def check_tool_choice(value: Any, param: str) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "name": value["name"]}
    raise ClientEventError(f"'{param}' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                           "\"name\": ...}.", param=param)


def check_modalities(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or len(value) != 1 or value[0] not in MODALITIES:
        raise ClientEventError(f"'{param}' must be [\"audio\"] (speech with its transcript) or [\"text\"].",
                               param=param)
    return list(value)


def check_max_tokens(value: Any, param: str) -> int | str:
    if value == "inf" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_OUTPUT_TOKENS):
        return value
    raise ClientEventError(f"'{param}' must be an integer from 1 to {MAX_OUTPUT_TOKENS}, or \"inf\".", param=param)


# The shapes of OpenAI's session (RealtimeSessionCreateRequestGA, and the beta's temperature), for
# their field names only: values are read and checked by hand below, so that an error is an error
# event naming the field's path. A field it knows and this server does not serve (tracing,
# include, prompt ...) is taken and left unused, as a client of OpenAI's sends them; one it does
# not know is an error, as at OpenAI.
class _Transcription(ApiModel):
    delay: Any = None
    keywords: Any = None
    language: Any = None
    languages: Any = None
    model: Any = None
    prompt: Any = None


class _TurnDetection(ApiModel):
    type: Any = None
    create_response: Any = None
    idle_timeout_ms: Any = None
    interrupt_response: Any = None
    prefix_padding_ms: Any = None
    silence_duration_ms: Any = None
    threshold: Any = None
    eagerness: Any = None


class _AudioInput(ApiModel):
    format: Any = None
    noise_reduction: Any = None
    transcription: Any = None
    turn_detection: Any = None


class _AudioOutput(ApiModel):
    format: Any = None
    speed: Any = None
    voice: Any = None


class _Audio(ApiModel):
    input: Any = None
    output: Any = None


class _Session(ApiModel):
    type: Any = None
    model: Any = None
    instructions: Any = None
    output_modalities: Any = None
    audio: Any = None
    include: Any = None
    max_output_tokens: Any = None
    parallel_tool_calls: Any = None
    prompt: Any = None
    reasoning: Any = None
    tool_choice: Any = None
    tools: Any = None
    tracing: Any = None
    truncation: Any = None
    temperature: Any = None


SHAPES: dict[str, type[ApiModel]] = {
    "session": _Session, "session.audio": _Audio, "session.audio.input": _AudioInput,
    "session.audio.input.transcription": _Transcription, "session.audio.input.turn_detection": _TurnDetection,
    "session.audio.output": _AudioOutput,
}


def check_known(session: dict[str, Any], allow: bool) -> None:
    """The one unknown-field check (ApiModel's), at every level of a session, as an error event
    naming the field's path (``session.audio.output.voise``: "Did you mean 'voice'?")."""
    def walk(obj: Any, where: str) -> None:
        shape = SHAPES.get(where)
        if shape is None or not isinstance(obj, dict):
            return
        try:
            shape.refuse_unknown_in(obj, allow=allow, where=where)
        except InvalidRequestError as e:
            raise ClientEventError(e.message, param=e.param, code="unknown_parameter") from None
        for key, value in obj.items():
            walk(value, f"{where}.{key}")

    walk(session, "session")


def update(config: SessionConfig, session: Any, voices_ok, *, allow_unknown: bool = False) -> SessionConfig:
    """``config`` with a ``session.update``'s ``session`` applied (a partial object: fields left
    out keep their values). ``voices_ok(name)`` checks a voice; ``allow_unknown``: the
    allow_unknown_fields setting (fields no session has are then ignored)."""
    if not isinstance(session, dict):
        raise ClientEventError("'session' must be an object, such as {\"instructions\": \"...\"}.", param="session")
    check_known(session, allow_unknown)
    if session.get("type", "realtime") != "realtime":
        raise ClientEventError("'session.type' must be \"realtime\" (transcription sessions are not served here).",
                               param="session.type")
    new = config.copy()
    if "instructions" in session:
        text = get(session, "instructions", str, where="session") or ""
        if len(text) > MAX_INSTRUCTIONS:
            raise ClientEventError(f"'session.instructions' is over {MAX_INSTRUCTIONS} characters.",
                                   param="session.instructions")
        new.instructions = text
    if "output_modalities" in session:
        new.output_modalities = check_modalities(session["output_modalities"], "session.output_modalities")
    audio = get(session, "audio", dict, where="session") or {}
    inp = get(audio, "input", dict, where="session.audio") or {}
    out = get(audio, "output", dict, where="session.audio") or {}
    if "format" in inp:
        new.input_format = _format(inp["format"], "session.audio.input.format")
    if "transcription" in inp:
        t = inp["transcription"]
        if t is not None and not isinstance(t, dict):
            raise ClientEventError("'session.audio.input.transcription' must be an object such as "
                                   "{\"model\": \"whisper-1\"}, or null.", param="session.audio.input.transcription")
        new.transcription = None if t is None else {k: v for k, v in t.items()
                                                    if k in ("model", "language", "prompt") and isinstance(v, str)}
        if new.transcription is not None:
            new.transcription.setdefault("model", "whisper-1")
    if "turn_detection" in inp:
        new.turn_detection = _turn_detection(inp["turn_detection"], "session.audio.input.turn_detection")
    if "format" in out:
        new.output_format = _format(out["format"], "session.audio.output.format")
    if "voice" in out:
        voice = get(out, "voice", str, where="session.audio.output")
        if voice is not None:
            voices_ok(voice)
            new.voice = voice
    if "speed" in out:
        speed = get(out, "speed", (int, float), where="session.audio.output")
        if speed is not None and not SPEEDS[0] <= speed <= SPEEDS[1]:
            raise ClientEventError(f"'session.audio.output.speed' must be from {SPEEDS[0]} to {SPEEDS[1]}.",
                                   param="session.audio.output.speed")
        new.speed = float(speed) if speed is not None else 1.0
    if "tools" in session:
        new.tools = check_tools(session["tools"] or [], "session.tools")
    if "tool_choice" in session:
        new.tool_choice = check_tool_choice(session["tool_choice"], "session.tool_choice")
    if "max_output_tokens" in session:
        new.max_output_tokens = check_max_tokens(session["max_output_tokens"], "session.max_output_tokens")
    if "temperature" in session:
        temp = get(session, "temperature", (int, float), where="session")
        if temp is not None and not 0.0 <= temp <= 2.0:
            raise ClientEventError("'session.temperature' must be from 0.0 to 2.0.", param="session.temperature")
        new.temperature = None if temp is None else float(temp)
    return new


def describe(config: SessionConfig, *, session_id: str, model: str, expires_at: int) -> dict[str, Any]:
    """The ``session`` of session.created / session.updated."""
    audio_in: dict[str, Any] = {"format": _format_json(config.input_format), "turn_detection": config.turn_detection}
    if config.transcription is not None:
        audio_in["transcription"] = dict(config.transcription)
    return {"type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "expires_at": expires_at, "output_modalities": list(config.output_modalities),
            "instructions": config.instructions,
            "audio": {"input": audio_in, "output": {"format": _format_json(config.output_format),
                                                    "voice": config.voice, "speed": config.speed}},
            "tools": copy.deepcopy(config.tools), "tool_choice": copy.deepcopy(config.tool_choice),
            "max_output_tokens": config.max_output_tokens}


def _format_json(fmt: str) -> dict[str, Any]:
    return {"type": fmt, "rate": 24000} if fmt == "audio/pcm" else {"type": fmt}


def response_config(config: SessionConfig, response: Any) -> SessionConfig:
    """The settings of one response: the session's, with a ``response.create``'s overrides."""
    if response is None:
        return config.copy()
    if not isinstance(response, dict):
        raise ClientEventError("'response' must be an object.", param="response")
    new = config.copy()
    if "instructions" in response:
        new.instructions = get(response, "instructions", str, where="response") or ""
    if "output_modalities" in response:
        new.output_modalities = check_modalities(response["output_modalities"], "response.output_modalities")
    if "tools" in response:
        new.tools = check_tools(response["tools"] or [], "response.tools")
    if "tool_choice" in response:
        new.tool_choice = check_tool_choice(response["tool_choice"], "response.tool_choice")
    if "max_output_tokens" in response:
        new.max_output_tokens = check_max_tokens(response["max_output_tokens"], "response.max_output_tokens")
    out = ((get(response, "audio", dict, where="response") or {}).get("output") or {})
    if isinstance(out, dict) and isinstance(out.get("voice"), str):
        new.voice = out["voice"]
    if isinstance(out, dict) and "format" in out:
        new.output_format = _format(out["format"], "response.audio.output.format")
    return dataclasses.replace(new)
