"""Generated text split into content and tool calls, as the text arrives."""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from .spec import CALL_CLOSE, CALL_OPEN, ToolSet
from .validation import is_valid

log = logging.getLogger(__name__)


@dataclass
class Content:
    text: str


@dataclass
class CallDelta:
    """Part of call ``index``: its start (id and name set, arguments "") or an arguments fragment."""
    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class ToolCallStream:
    """Splits generated text into content and tool calls, as the text arrives.

    ``incremental``: stream each call's arguments while they are generated (used when a grammar
    guarantees the calls; not for a function whose grammar was relaxed, see ``Tool.exact``).
    Otherwise each call is held until it is complete, then validated, and sent as a call only if
    valid; anything else is sent as content. Without parallel calls,
    whatever follows the first call is dropped.
    """

    def __init__(self, ts: ToolSet, *, incremental: bool):
        self.ts = ts
        self.incremental = incremental
        self._buf = ts.prefill          # what the prompt already holds of the answer comes first
        self._in_call = False
        self._call = ""                 # text of the open call after CALL_OPEN
        self._args_sent = 0             # characters of the open call's arguments already sent
        self._started: CallDelta | None = None
        self._blank = ""                # whitespace held back: between calls it is not content
        self.calls: list[dict[str, Any]] = []   # completed, valid calls, OpenAI-shaped
        self.cut: set[int] = set()      # indices of calls cut short inside their arguments

    # content ---------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Content | CallDelta]:
        return self._content_first(self._feed(text))

    def _content_first(self, items: list[Content | CallDelta]) -> list[Content | CallDelta]:
        """Whitespace-only content is held until real content follows, so the blank lines around
        calls never reach the client as content."""
        out: list[Content | CallDelta] = []
        for item in items:
            if isinstance(item, Content):
                text = self._blank + item.text
                if text.strip():
                    self._blank = ""
                    out.append(Content(text))
                else:
                    self._blank = text
            else:
                out.append(item)
        return out

    @property
    def _done(self) -> bool:
        """No more may follow: one call was made, and calls are not parallel."""
        return bool(self.calls) and not self.ts.parallel

    def _feed(self, text: str) -> list[Content | CallDelta]:
        out: list[Content | CallDelta] = []
        self._buf += text
        while self._buf:
            if self._done:
                self._buf = ""
                break
            if not self._in_call:
                i = self._buf.find(CALL_OPEN)
                if i == -1:
                    keep = _partial_suffix(self._buf, CALL_OPEN)
                    if len(self._buf) > keep:
                        out.append(Content(self._buf[:len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep:]
                    break
                if i:
                    out.append(Content(self._buf[:i]))
                self._buf = self._buf[i + len(CALL_OPEN):]
                self._in_call, self._call, self._args_sent, self._started = True, "", 0, None
            else:
                j = self._buf.find(CALL_CLOSE)
                if j == -1:
                    keep = _partial_suffix(self._buf, CALL_CLOSE)
                    self._call += self._buf[:len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    if self._streams():
                        out.extend(self._stream_arguments())
                    break
                self._call += self._buf[:j]
                self._buf = self._buf[j + len(CALL_CLOSE):]
                self._in_call = False
                out.extend(self._close_call())
        return out

    def finish(self) -> list[Content | CallDelta]:
        """The generation ended: what is still held is content, except a call it ended inside, or
        the start of an opening marker it ended inside (cut by max_tokens)."""
        out = self._feed("")            # (a prefill the generation added nothing to)
        if self._in_call:
            out.extend(self._cut_call())
        elif self._buf and not self._cut_marker():
            out.append(Content(self._buf))
        self._buf, self._in_call = "", False
        out = self._content_first(out)
        if self._blank and not self.calls:
            out.append(Content(self._blank))
        self._blank = ""
        return out

    def _cut_marker(self) -> bool:
        """Whether the text held at the end (a beginning of CALL_OPEN) is a call's opening marker
        cut short rather than the answer's last characters: always where only calls may be written
        or after a call, and from two characters on ("<t") elsewhere; a lone "<" stays content."""
        return self.ts.forced or bool(self.calls) or len(self._buf) > 1

    def _cut_call(self) -> list[Content | CallDelta]:
        """The generation ended inside a call (max_tokens). Streamed or not, the outcome is the
        same and the markup never becomes content: a call whose JSON is complete is a call (only
        its closing marker was cut); one cut inside its arguments is a call with the arguments
        written so far, as OpenAI returns a call cut by max_tokens (finish_reason "length" tells
        the client); one cut before its name is complete is nothing."""
        if self._parse(self._call) is not None:
            return self._close_call()
        if self._started is not None:
            self.cut.add(len(self.calls))
            return self._finish_started(cut=True)
        m = self._HEAD.match(self._call)
        name = json.loads(f'"{m.group(1)}"') if m else None
        if name not in self.ts.allowed:
            return []
        index, call_id, arguments = len(self.calls), f"call_{uuid.uuid4().hex[:24]}", self._arguments_text()
        self.cut.add(index)
        self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        return [CallDelta(index, "", id=call_id, name=name),
                *(CallDelta(index, part) for part in _fragments(arguments))]

    def _streams(self) -> bool:
        """Whether the open call's arguments go out as they are generated: a grammar guarantees
        the calls, and it enforces the whole schema of the function named (a function whose
        grammar was relaxed has its calls held until they are complete and validated)."""
        if not self.incremental or self._started is not None:
            return self.incremental
        m = self._HEAD.match(self._call)
        if not m:
            return True
        try:
            tool = self.ts.by_name.get(json.loads(f'"{m.group(1)}"'))
        except json.JSONDecodeError:
            return True
        return tool is None or tool.exact

    # calls -----------------------------------------------------------------------------------
    def _parse(self, text: str) -> tuple[str, Any] | None:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or set(obj) - {"name", "arguments", "parameters"}:
            return None
        name, args = obj.get("name"), obj.get("arguments", obj.get("parameters", {}))
        tool = self.ts.by_name.get(name) if isinstance(name, str) else None
        if tool is None or name not in self.ts.allowed or not isinstance(args, dict):
            return None
        if not is_valid(tool.validator, args):
            if not self.ts.forced:
                return None
            # The client asked for a call, and the grammar made this one well-formed; only the parts
            # of the schema it could not enforce (Tool.exact) fail. It is returned as written, as
            # OpenAI returns a call of a non-strict function, rather than as text.
            log.warning("a call to %s does not match the parts of its schema the grammar could not enforce",
                        name)
        return name, args

    def _close_call(self) -> list[Content | CallDelta]:
        parsed = self._parse(self._call)
        if parsed is None:
            if self.incremental and self._started is not None:
                return self._finish_started()
            return [Content(CALL_OPEN + self._call + CALL_CLOSE)]
        name, args = parsed
        arguments = json.dumps(args, ensure_ascii=False) if not self.incremental else self._arguments_text()
        index = len(self.calls)
        call_id = self._started.id if self._started else f"call_{uuid.uuid4().hex[:24]}"
        self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        if self.incremental:
            return list(self._stream_arguments(final=True))
        return [CallDelta(index, "", id=call_id, name=name),
                *(CallDelta(index, part) for part in _fragments(arguments))]

    def _finish_started(self, *, cut: bool = False) -> list[Content | CallDelta]:
        """A streamed call that does not validate (a grammar rules this out), or that was cut
        short. Its id, name and first arguments are out already, so it is finished as written
        rather than dropped, which would leave the client a half call and give its index to the
        next one."""
        assert self._started is not None
        if not cut:
            log.warning("a streamed call to %s does not match its schema", self._started.name)
        self.calls.append({"id": self._started.id, "type": "function",
                           "function": {"name": self._started.name, "arguments": self._arguments_text()}})
        return list(self._stream_arguments(final=True))

    # incremental streaming of a call the grammar guarantees ------------------------------------
    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')

    def _arguments_text(self) -> str:
        m = self._HEAD.match(self._call)
        return _json_value_prefix(self._call[m.end():])[0] if m else ""

    def _stream_arguments(self, final: bool = False) -> Iterator[CallDelta]:
        m = self._HEAD.match(self._call)
        if not m:
            return
        index = len(self.calls) - (1 if final else 0)
        if self._started is None:
            self._started = CallDelta(index, "", id=f"call_{uuid.uuid4().hex[:24]}", name=json.loads(f'"{m.group(1)}"'))
            yield self._started
        value, _complete = _json_value_prefix(self._call[m.end():])
        if len(value) > self._args_sent:
            yield CallDelta(index, value[self._args_sent:])
            self._args_sent = len(value)


def _partial_suffix(text: str, marker: str) -> int:
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _fragments(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _json_value_prefix(text: str) -> tuple[str, bool]:
    """The longest prefix of ``text`` that belongs to the JSON value it starts with, and whether
    that value is complete. Strings and escapes are tracked so braces inside them do not count."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return text[:i + 1], True
            if depth < 0:
                return text[:i], True
    return text, False
