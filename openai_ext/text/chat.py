"""POST /v1/chat/completions: messages in, a chat completion (or its chunks) out. No HTTP here."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator

from ..core.admission import Place
from ..core.errors import InvalidRequestError
from ..core.streaming import Framed, Framing
from ..hosts.base import ChatPrompt, Host, Prompt, TokenLogprob
from ..hosts.request import ChatOptions
from . import images as image_parts
from . import params, render, tools, webui_fields
from .assembly import usage
from .generation import ChoiceResult, Job, bound_text, fit_prompt, new_job, run_job
from .output import Event, OutputParser, Thinking
from .protocol import ChatCompletionRequest, ChatMessage
from .service import TextService

if TYPE_CHECKING:
    from PIL.Image import Image

# This endpoint streams in OpenAI's framing (text.service.TextEndpoint).
framing: Framing | None = None


def _text_of(message: ChatMessage, i: int, images: list[Image] | None, web_ui: bool) -> str:
    """The message's text. Its image parts are decoded into ``images`` (a host with vision)
    and stand in the text as the web UI's placeholders; without vision they are refused."""
    content = message.content
    if content is None:
        calls = message.tool_calls or message.function_call
        if (message.role == "assistant" and calls) or message.role == "function":
            return ""
        raise InvalidRequestError(f"messages[{i}].content is missing; {message.role} messages need content.",
                                  param=f"messages[{i}].content")
    if isinstance(content, str):
        return content
    texts, seen = [], 0
    for j, part in enumerate(content):
        if part.type == "text":
            texts.append(part.text)
        elif part.type == "refusal":
            texts.append(part.refusal)
        elif part.type == "image_url":
            where = f"messages[{i}].content[{j}]"
            if images is None:
                raise image_parts.no_vision(where, web_ui)
            ref = (part.model_extra or {}).get("image_url")
            images.append(image_parts.decode(ref.get("url") if isinstance(ref, dict) else ref,
                                             f"{where}.image_url.url"))
            seen += 1
        else:
            raise InvalidRequestError(
                f"messages[{i}].content[{j}] is of type '{part.type}', which the loaded text model cannot read. "
                "Send text parts only.", param=f"messages[{i}].content[{j}].type")
    # Text parts are separate paragraphs of one message.
    return image_parts.with_placeholders(texts, seen)


def normalize_messages(req: ChatCompletionRequest, images: list[Image] | None = None, *,
                       web_ui: bool = False) -> list[dict[str, Any]]:
    """OpenAI messages as plain dicts the chat templates understand: string content, and the
    developer role (OpenAI's newer name for system) as system. The legacy function calling turns
    become tool turns: an assistant function_call is a tool call with a made-up id, and a
    'function' message is the tool result for the latest call of that name."""
    out = []
    legacy_ids: dict[str, str] = {}   # function name -> id given to its latest legacy call
    for i, m in enumerate(req.messages):
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        msg: dict[str, Any] = {"role": role, "content": _text_of(m, i, images, web_ui)}
        if m.name:
            msg["name"] = m.name
        if m.role == "function":
            if not m.name:
                raise InvalidRequestError(f"messages[{i}] has the legacy role 'function' but no name; give the name "
                                          "of the function whose result it holds.", param=f"messages[{i}].name")
            msg["tool_call_id"] = legacy_ids.get(m.name) or f"call_legacy_{i}"
        elif m.role == "tool":
            if not m.tool_call_id:
                raise InvalidRequestError(f"messages[{i}] has role 'tool' but no tool_call_id.",
                                          param=f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
        if m.function_call is not None and m.role == "assistant":
            if m.tool_calls:
                raise InvalidRequestError(f"messages[{i}] has both tool_calls and the legacy function_call; send "
                                          "one of them.", param=f"messages[{i}].function_call")
            legacy_ids[m.function_call.name] = f"call_legacy_{i}"
            msg["tool_calls"] = [{"id": f"call_legacy_{i}", "type": "function",
                                  "function": m.function_call.model_dump()}]
        if m.tool_calls:
            msg["tool_calls"] = [tc.model_dump() for tc in m.tool_calls]
        out.append(msg)
    return out


def check_tool_answers(req: ChatCompletionRequest) -> None:
    """Every tool call of an assistant message is answered by a tool message right after it (the
    tool messages that follow it, in any order), as OpenAI requires: a history with calls left
    unanswered is a 400 naming them, not a prompt the model would misread. Only the chat
    endpoint's own requests are checked; the APIs served through chat check their own rules."""
    messages = req.messages
    for i, m in enumerate(messages):
        if m.role != "assistant" or not m.tool_calls:
            continue
        answered, j = set(), i + 1
        while j < len(messages) and messages[j].role == "tool":
            answered.add(messages[j].tool_call_id)
            j += 1
        missing = [c.id for c in m.tool_calls if c.id not in answered]
        if not missing:
            continue
        where = f"messages[{j}].role" if j < len(messages) else f"messages[{i}].tool_calls"
        raise InvalidRequestError(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(missing)}. "
            f"Right after messages[{i}], send a message with role 'tool' and that tool_call_id for each of them "
            "(the tool's result, or an error text), before any other message.", param=where)


@dataclass
class TemplateInput:
    """What the host's chat template renders for a request, and the images its prompt carries
    (one per <__media__> placeholder of the rendered text)."""
    messages: list[dict[str, Any]]
    options: ChatOptions
    images: list[Image]

    def render(self, host: Host) -> ChatPrompt:
        return host.chat_prompt(self.messages, self.options)


def template_input(host: Host, req: ChatCompletionRequest, toolset: tools.ToolSet | None) -> TemplateInput:
    """The messages and options the host's chat template renders for this request."""
    native = tools.template_is_native(host.chat_template)
    images: list[Image] | None = [] if host.abilities.vision else None
    messages = normalize_messages(req, images, web_ui=host.abilities.web_ui)
    messages, tools_arg = tools.for_template(messages, toolset, native=native)
    # the web UI's chat modes, characters, templates and reasoning switches (extension mode)
    web_ui = webui_fields.template_settings(req.sent_extra(), host.abilities, chat=True,
                                            reasoning_effort=req.reasoning_effort)
    return TemplateInput(messages, ChatOptions(tools=tools_arg or None, **web_ui), images or [])


def _content_chars(req: ChatCompletionRequest) -> int:
    total = 0
    for m in req.messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content:
            total += sum(len(getattr(part, "text", None) or getattr(part, "refusal", None) or "")
                         for part in m.content)
    return total


def prepare(text: TextService, req: ChatCompletionRequest, *, prefill: str = "",
            truncate: bool | None = None) -> Job:
    """``prefill``: the start of the answer, already written; the model continues it (the text
    is not repeated in the output). ``truncate`` overrides the truncate_prompt setting, for an
    API whose request says what to do with a prompt that does not fit (the Responses API's
    ``truncation``)."""
    host = text.host
    truncate = text.settings.truncate_prompt if truncate is None else truncate
    # Messages whose text alone cannot fit are refused before the template and the tokenizer
    # run over them (a list of 100,000 messages would keep both busy for minutes).
    bound_text(host, _content_chars(req), truncate=truncate, param="messages")
    toolset = tools.parse(req)
    if toolset is not None and toolset.calling and not prefill and host.abilities.grammar:
        toolset.prefill = tools.named_call_prefill(toolset)
    given = template_input(host, req, toolset)
    rendered = given.render(host)
    prefill += toolset.prefill if toolset is not None else ""
    prompt_text = bound_text(host, rendered.text + prefill, truncate=truncate, param="messages")
    prompt = Prompt(prompt_text, host.prompt_tokens(prompt_text, given.images), rendered.stops, rendered.trim_start,
                    given.images)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    prompt = fit_prompt(host, prompt, requested=requested, truncate=truncate, param="messages")
    plan = params.plan(req, abilities=host.abilities, room=host.context_length() - len(prompt.tokens),
                       max_n=text.settings.max_n, toolset=toolset,
                       default_max_tokens=text.settings.default_max_tokens)
    _check_grammar(host, plan.settings.grammar, toolset,
                   sent=bool(req.sent_extra().get("grammar_string")))
    host.check_settings(plan.settings)
    job = new_job("chatcmpl", [prompt], plan, host)
    job.tools = toolset if toolset is not None and toolset.calling else None
    return job


def _check_grammar(host: Host, gbnf: str | None, toolset: tools.ToolSet | None, *, sent: bool = False) -> None:
    """A grammar the host cannot parse is refused now, not found out while generating. ``sent``:
    the request's own grammar_string."""
    if not gbnf or host.check_grammar(gbnf):
        return
    if sent:
        raise InvalidRequestError("grammar_string could not be parsed by llama.cpp as a GBNF grammar; check its "
                                  "rules (a root rule, quoted literals, defined names).", param="grammar_string")
    param = toolset.param if toolset is not None and toolset.calling else "response_format"
    raise InvalidRequestError("The grammar built from {param} could not be parsed by llama.cpp; simplify the "
                              "schema (patterns especially).", param=param)


class _Choice:
    """One choice on its way out: its text split into content and tool calls."""

    def __init__(self, job: Job, *, incremental: bool | None = None):
        self.output = OutputParser.for_job(job, incremental=incremental)
        self.legacy = bool(job.tools and job.tools.legacy)
        self.opened = False   # the role has been sent

    def events(self, text: str, *, final: bool = False) -> list[Event]:
        return self.output.feed(text, final=final)

    def finish_reason(self, reason: str) -> str:
        # Cut short by max_tokens (or the context) is "length" even after complete calls, as at
        # OpenAI: the client must know the answer is unfinished.
        if self.output.called and reason != "length":
            return "function_call" if self.legacy else "tool_calls"
        return reason

    def delta(self, event: tools.Content | tools.CallDelta | Thinking | None) -> dict[str, Any]:
        """The delta for ``event`` (None: no event); the first delta of a choice carries its role,
        with content null when the answer starts with a call, as OpenAI sends it."""
        out = self._delta(event)
        if self.opened:
            return out
        self.opened = True
        return {"role": "assistant", "content": None if isinstance(event, tools.CallDelta) else "",
                "refusal": None, **out}

    def _delta(self, event: tools.Content | tools.CallDelta | Thinking | None) -> dict[str, Any]:
        if event is None:
            return {}
        if isinstance(event, Thinking):
            return {"reasoning_content": event.text}
        if isinstance(event, tools.Content):
            return {"content": event.text}
        if self.legacy:
            fn = {"name": event.name, "arguments": event.arguments} if event.id else {"arguments": event.arguments}
            return {"function_call": fn}
        call: dict[str, Any] = {"index": event.index, "function": {"arguments": event.arguments}}
        if event.id:
            call.update(id=event.id, type="function")
            call["function"]["name"] = event.name
        return {"tool_calls": [call]}

    def message(self, result: ChoiceResult) -> tuple[str | None, list[dict[str, Any]] | None]:
        """(content, tool calls) for a whole, non-streamed answer; its thinking goes to
        ``self.output.thinking``."""
        events = self.events(result.text, final=True)
        text = "".join(e.text for e in events if isinstance(e, tools.Content))
        if self.output.stream is None:
            return text, None
        calls = self.output.calls or None
        return (text or None) if calls else text, calls


async def complete(text: TextService, job: Job, place: Place) -> dict[str, Any]:
    results: list[ChoiceResult] = []
    async with contextlib.aclosing(run_job(text, job, place)) as events:
        async for ev in events:
            if ev.result is not None:
                results.append(ev.result)
    want_lp = job.plan.logprobs is not None
    choices = []
    for r in results:
        out = _Choice(job, incremental=False)
        content, calls = out.message(r)
        choice = render.chat_choice(r.index, content, out.finish_reason(r.finish_reason),
                                       r.logprobs if want_lp else None)
        if out.output.thinking:
            choice["message"]["reasoning_content"] = out.output.thinking
        if calls and out.legacy:
            choice["message"]["function_call"] = calls[0]["function"]
        elif calls:
            choice["message"]["tool_calls"] = calls
        choices.append(choice)
    return render.chat_completion(job, text.fingerprint, choices, job.prompt_tokens,
                                     sum(r.tokens for r in results))


async def stream(text: TextService, job: Job, place: Place) -> AsyncGenerator[dict[str, Any] | Framed, None]:
    plan, fp = job.plan, text.fingerprint
    include_usage = plan.include_usage
    want_lp = plan.logprobs is not None
    open_choices: dict[int, _Choice] = {}
    pending_lp: dict[int, list[TokenLogprob]] = {}
    completion_tokens = 0

    def chunk(index: int, delta: dict[str, Any], *, finish: str | None = None) -> dict[str, Any]:
        # Log-probabilities ride on the next chunk sent for their choice (text can be held back).
        lp = None
        if want_lp and (finish is None or pending_lp.get(index)):
            lp, pending_lp[index] = pending_lp.get(index, []), []
        return render.chat_chunk(job, fp, [render.chat_chunk_choice(index, delta, logprobs=lp,
                                                                          finish_reason=finish)],
                                    include_usage=include_usage)

    plain = None if want_lp else render.ContentFrames(job, fp, include_usage=include_usage)
    async with contextlib.aclosing(run_job(text, job, place)) as events:
        async for ev in events:
            choice = open_choices.get(ev.index)
            if choice is None:
                choice = open_choices[ev.index] = _Choice(job)
                if choice.output.stream is None:  # with tools, the role waits for the first event
                    yield chunk(ev.index, choice.delta(None))
            if ev.delta is not None:
                pending_lp.setdefault(ev.index, []).extend(ev.delta.logprobs)
                for event in choice.events(ev.delta.text):
                    if plain is not None and choice.opened and type(event) is tools.Content:
                        yield plain.frame(ev.index, event.text)
                    else:
                        yield chunk(ev.index, choice.delta(event))
            elif ev.result is not None:
                for event in choice.events("", final=True):
                    yield chunk(ev.index, choice.delta(event))
                if not choice.opened:
                    yield chunk(ev.index, choice.delta(None))
                completion_tokens += ev.result.tokens
                yield chunk(ev.index, {}, finish=choice.finish_reason(ev.result.finish_reason))
    if include_usage:
        yield render.chat_chunk(job, fp, [], include_usage=True,
                                   usage_=usage(job.prompt_tokens, completion_tokens))
