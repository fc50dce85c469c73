"""The one place where OpenAI request parameters become host generation settings.

``plan()`` is a pure function of the request, the host's abilities and the room left in the
context. Its output is the hosts' typed request (``hosts.request.GenerationSettings``), which
each host translates into its own vocabulary; the "Host setting" column of ``RULES`` names the
web UI's setting a parameter ends up in. ``RULES`` says, for every parameter, whether it is mapped,
handled by the server, ignored by design, or rejected; the README's table is generated from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..core import rules
from ..core.errors import InvalidRequestError
from ..core.rules import Rule
from ..hosts.base import HOST_SAMPLERS, HostAbilities
from ..hosts.request import GenerationSettings
from . import grammar, tools, webui_fields
from .protocol import ChatCompletionRequest, CompletionRequest
from .tools import ToolSet

log = logging.getLogger(__name__)

BOTH, CHAT, COMPLETIONS = "both", "chat", "completions"

RULES: tuple[Rule, ...] = (
    Rule("model", BOTH, "server", "-", "Any name is accepted. Standalone, a name from the catalog (models_dir, the models setting) gets that model, loaded on demand; any other name is served by the default model."),
    Rule("keep_alive", BOTH, "server", "-", "Extension, as Ollama takes it: how long a catalog model named by this request stays loaded while idle (seconds, or '30s', '5m', '1h'; negative: for good; 0: unloaded once idle). Default: the keep_alive setting. The default model stays loaded; in extension mode it is accepted and does nothing."),
    Rule("messages", CHAT, "server", "prompt", "Rendered with the model's chat template. Roles: system, developer (as system), user, assistant, tool. Content: a string or text parts; image_url parts (base64 data URLs) reach a vision model (loaded in the web UI, or standalone with its projector; each image counts as the tokens the model reads for it), else a 400 naming the part; file parts ({file: {file_id}} of an uploaded file, or {file_data, filename}) are read as text (text, code, Markdown, JSON, HTML, PDF) and join the message; audio parts get a 400."),
    Rule("prompt", COMPLETIONS, "server", "prompt", "A string, a list of strings (one choice set per prompt; at most the max_prompts setting), token ids, or a list of token-id lists."),
    Rule("max_tokens", BOTH, "mapped", "max_new_tokens", "Default: 16 for completions; for chat the rest of the context, or the default_max_tokens setting when it is set. Clamped to the room left in the context."),
    Rule("max_completion_tokens", CHAT, "mapped", "max_new_tokens", "Takes precedence over max_tokens."),
    Rule("temperature", BOTH, "mapped", "temperature, do_sample", "Default 1. 0 means greedy decoding (do_sample off, top_k 1)."),
    Rule("top_p", BOTH, "mapped", "top_p", "Default 1."),
    Rule("stop", BOTH, "mapped", "custom_stopping_strings", "A string or up to 4 strings. The stop text never appears in the output, streamed or not."),
    Rule("presence_penalty", BOTH, "mapped", "presence_penalty", "Default 0, the host sampler of the same name."),
    Rule("frequency_penalty", BOTH, "mapped", "frequency_penalty", "Default 0, the host sampler of the same name."),
    Rule("seed", BOTH, "mapped", "seed", "Same seed and same request give the same text. With n > 1, choice i uses seed + i. Default: random."),
    Rule("logit_bias", BOTH, "mapped", "logit_bias", "Keys are token ids of the loaded model's tokenizer (see /v1/internal/encode); -100 bans a token. 400 if the host cannot apply it."),
    Rule("logprobs", BOTH, "mapped", "logprobs", "Completions: 0-5 alternatives per token. Chat: true/false. 400 if the host cannot report log-probabilities."),
    Rule("top_logprobs", CHAT, "mapped", "logprobs", "0-20 alternatives per token; needs logprobs: true."),
    Rule("n", BOTH, "server", "-", "Choices are generated one after another, each with its own index, streaming included. At most the max_n setting."),
    Rule("best_of", COMPLETIONS, "server", "-", "Generates best_of candidates and returns the n with the highest mean log-probability per token. Not with stream. Needs a host with log-probabilities."),
    Rule("echo", COMPLETIONS, "server", "-", "Prepends the prompt to each choice's text (and its token log-probabilities when logprobs is set)."),
    Rule("suffix", COMPLETIONS, "server", "-", "Fill-in-the-middle with the model's own FIM tokens; 400 for models that have none."),
    Rule("stream", BOTH, "server", "-", "Server-sent events, data: {json} chunks, then data: [DONE]."),
    Rule("stream_options", BOTH, "server", "-", "include_usage adds a last chunk with usage and empty choices; other chat chunks carry usage: null (completions chunks carry no usage key, as the spec has it)."),
    Rule("user", BOTH, "ignored", "-", "Accepted; nothing to do locally."),
    Rule("response_format", CHAT, "mapped", "grammar_string", "text; json_object (any JSON object); json_schema (output follows the schema). Enforced by a grammar built from the schema (the project's own converter); with strict, a schema keyword the grammar cannot enforce gets a 400 naming it. With tools and tool_choice auto, the answer is either calls or this JSON."),
    Rule("tools", CHAT, "mapped", "grammar_string, prompt", "Function tools, rendered by the model's template when it knows the <tool_call> format (its source contains <tool_call>), else by the documented fallback. Calls come back in message.tool_calls."),
    Rule("tool_choice", CHAT, "mapped", "grammar_string", "none, auto, required, a named function, or allowed_tools. required and named: decoding is constrained to valid calls. auto: the embedded host constrains a call once the model writes <tool_call>; calls are always validated."),
    Rule("parallel_tool_calls", CHAT, "mapped", "grammar_string", "Default true: several calls may follow one another. false: at most one call; what follows it is dropped. Without tools: 400, as at OpenAI."),
    Rule("functions", CHAT, "mapped", "grammar_string, prompt", "Legacy function calling, mapped onto tools; the answer uses the legacy message.function_call and finish_reason function_call. In the history, an assistant function_call and a role function message (with name) become a tool call and its result. tool_choice next to functions: 400 (use function_call)."),
    Rule("function_call", CHAT, "mapped", "grammar_string", "Legacy: none, auto, or {\"name\": ...}, mapped onto tool_choice."),
    Rule("modalities", CHAT, "server", "-", "['text'] only; 'audio' gets a 400."),
    Rule("audio", CHAT, "rejected", "-", "Audio output is not produced by a text model: 400."),
    Rule("web_search_options", CHAT, "rejected", "-", "There is no web search: 400."),
    Rule("prediction", CHAT, "ignored", "-", "Predicted outputs only change latency at OpenAI; the text is the same without them."),
    Rule("reasoning_effort", CHAT, "mapped", "reasoning_effort, enable_thinking", "Extension mode: handed to the model's chat template as the web UI's reasoning_effort (minimal: low, xhigh: high); none turns thinking off (enable_thinking false). Standalone: ignored. Either way a reply's thinking comes back apart, as message.reasoning_content."),
    Rule("verbosity", CHAT, "ignored", "-", "No equivalent sampler."),
    Rule("service_tier", BOTH, "ignored", "-", "One local tier."),
    Rule("store", CHAT, "ignored", "-", "Nothing is stored."),
    Rule("metadata", CHAT, "ignored", "-", "Nothing is stored."),
    Rule("prompt_cache_key", CHAT, "ignored", "-", "The embedded host reuses the cached prefix of the previous prompt by itself; no key is needed."),
    Rule("prompt_cache_retention", CHAT, "ignored", "-", "As prompt_cache_key."),
    Rule("prompt_cache_options", CHAT, "ignored", "-", "As prompt_cache_key."),
    Rule("safety_identifier", CHAT, "ignored", "-", "Accepted; nothing to do locally."),
    Rule("moderation", CHAT, "ignored", "-", "Outputs are not moderated; call /v1/moderations yourself."),
    # This project's extensions: the web UI API's own fields (see webui_fields.py).
    Rule("mode", CHAT, "mapped", "mode", "Extension: the web UI's chat mode, instruct (default), chat or chat-instruct. Standalone: 400 for any but instruct. Like every field below, an empty value (null, \"\", false) asks for nothing."),
    Rule("character", CHAT, "mapped", "name2, context, greeting", "Extension: a character of the web UI's characters folder, by name (chat and chat-instruct modes); an unknown one is a 400 listing those there. Standalone: 400."),
    Rule("instruction_template", CHAT, "mapped", "instruction_template_str", "Extension: a template of the web UI's instruction-templates folder, by name, instead of the model's own. Standalone: 400."),
    Rule("instruction_template_str", CHAT, "mapped", "instruction_template_str", "Extension: a Jinja2 instruction template; takes precedence over instruction_template. Standalone: 400."),
    Rule("chat_template_str", CHAT, "mapped", "chat_template_str", "Extension: the Jinja2 template of chat mode. Standalone: 400."),
    Rule("name1", CHAT, "mapped", "name1", "Extension: the user's name in chat modes (also user_name). Standalone: 400."),
    Rule("name2", CHAT, "mapped", "name2", "Extension: the bot's name, over the character's (also bot_name). Standalone: 400."),
    Rule("context", CHAT, "mapped", "context", "Extension: the character's context, over the character's own. Standalone: 400."),
    Rule("greeting", CHAT, "mapped", "greeting", "Extension: the character's greeting, over its own. Standalone: 400."),
    Rule("user_bio", CHAT, "mapped", "user_bio", "Extension: the user's description in chat modes. Standalone: 400."),
    Rule("chat_instruct_command", CHAT, "mapped", "chat-instruct_command", "Extension: the chat-instruct command (<|character|>, <|prompt|>). Standalone: 400."),
    Rule("continue_", CHAT, "mapped", "_continue", "Extension: continue the last assistant message instead of starting a new one. Standalone: 400."),
    Rule("enable_thinking", CHAT, "mapped", "enable_thinking", "Extension: handed to the model's chat template (Qwen3 and others read it). Standalone: ignored."),
    Rule("preset", BOTH, "mapped", "the preset's samplers", "Extension: a preset of the web UI's presets folder, by name: its samplers apply, and the request's own sampler fields override them (OpenAI defaults such as temperature 1 are then not applied). Standalone: 400."),
    Rule("max_tokens_second", BOTH, "mapped", "max_tokens_second", "Extension: the web UI's output pacing. Standalone: ignored."),
    Rule("grammar_string", BOTH, "mapped", "grammar_string", "The web UI API's field: a GBNF grammar the output follows, in both modes (one the backend cannot parse is a 400). Not with a response_format or tools that constrain the output: 400."),
    Rule("truncation_length", BOTH, "ignored", "-", "The server fits each request to the model's context itself."),
    Rule("auto_max_new_tokens", BOTH, "ignored", "-", "max_tokens decides; without it, as described above."),
    Rule("unknown fields", BOTH, "rejected", "-", "Any other unknown field gets a 400 naming it, as at OpenAI, unless the allow_unknown_fields setting is on."),
    Rule("host samplers", BOTH, "mapped", "same name", "Extra fields named after the host's own samplers: " + ", ".join(
        ("top_k", "min_p", "typical_p", "repetition_penalty", "...")) + " (see HOST_SAMPLERS). 400 if the host lacks one."),
)


@dataclass
class Plan:
    """The host settings for one request, plus what the server does around the host."""
    settings: GenerationSettings
    n: int = 1
    best_of: int = 1                 # candidates to generate per prompt (>= n)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None      # alternatives per token the client sees; None: none
    echo: bool = False
    stops: list[str] = field(default_factory=list)   # applied by the server (generation.py)
    ignored: list[str] = field(default_factory=list)

    def settings_for_choice(self, index: int) -> GenerationSettings:
        """Choice ``index`` of a seeded request gets its own seed, so choices differ but repeat."""
        seed = self.settings.seed
        if seed is None or index == 0:
            return self.settings
        return self.settings.replace(seed=seed + index)


def _reject(param: str, message: str, **names: str) -> InvalidRequestError:
    """A 400 for ``param``. The message names request paths by slots ({param}, and ``names``:
    slot -> chat's path), so the families that serve chat under their own names rename them."""
    return InvalidRequestError(message, param=param, paths=names)


def check_prompts(count: int, max_prompts: int) -> None:
    """A list of more prompts than the max_prompts setting allows is a 400, as n above max_n is:
    each prompt is a generation (n of them), so the count bounds the request's work."""
    if count > max_prompts:
        raise _reject("prompt", f"prompt holds {count} prompts, above this server's limit of {max_prompts} (the "
                                "max_prompts setting). Send them in several requests.")


def plan(req: CompletionRequest | ChatCompletionRequest, *, abilities: HostAbilities, room: int,
         max_n: int, toolset: ToolSet | None = None, default_max_tokens: int = 0) -> Plan:
    """Maps one request onto host settings.

    ``room`` is how many tokens the context has left after the prompt; ``max_n`` is the largest
    ``n`` the server allows; ``toolset`` is the request's tools, already read by tools.parse();
    ``default_max_tokens`` (the setting), above 0, caps a chat reply that names no max_tokens.
    """
    chat = isinstance(req, ChatCompletionRequest)
    # the fields sent with a value: null is as good as left out (a family's request, built with
    # keyword arguments, names every field it maps, None where its own request had none)
    sent = {name for name in req.model_fields_set if getattr(req, name, None) is not None}
    max_new_tokens = _length(req, room, default_max_tokens)

    # --- sampling -----------------------------------------------------------------------
    extra = req.sent_extra()
    web_ui = webui_fields.generation_settings(extra, abilities)

    temperature, top_p, presence, frequency = _openai_samplers(req, "preset" in web_ui, sent)
    grammar_string: str | None = web_ui.get("grammar_string")
    triggers: tuple[str, ...] = ()

    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    stops = [s for s in stops if s]

    bias = _logit_bias(req, abilities)

    # --- log-probabilities --------------------------------------------------------------
    logprobs = _logprobs(req, abilities)
    host_logprobs = logprobs   # what the host computes: also for best_of's ranking

    # --- choices ------------------------------------------------------------------------
    n, best_of = _choices(req, abilities, max_n)
    stream = bool(req.stream)
    if best_of > n and logprobs is None:
        # Candidates are ranked by their log-probabilities, so the host must compute them
        # even when the client did not ask to see them (plan.logprobs stays None then).
        host_logprobs = 0
    include_usage = req.stream_options is not None and bool(req.stream_options.include_usage)
    if include_usage and not stream:
        raise _reject("stream_options", "stream_options is only allowed with stream: true.")

    # --- chat-only switches, structured output and tools ---------------------------------
    if isinstance(req, ChatCompletionRequest):
        _check_chat_switches(req)
        constrained = _constraints(req, toolset, abilities)
        if constrained is not None:
            if "grammar_string" in web_ui:
                raise _reject("grammar_string", "{param} cannot be combined with {format} or tools that constrain "
                                                "the output; send one or the other.", format="response_format")
            grammar_string, triggers = constrained

    # --- the host's own samplers, sent as extra fields ----------------------------------
    ignored = rules.ignored(RULES, sent)
    if chat and "reasoning_effort" in sent and not abilities.web_ui:
        ignored.append("reasoning_effort")   # only the web UI's templates take it
    samplers = _host_samplers(req, extra, abilities, ignored)
    if ignored:
        log.debug("ignored request fields: %s", ", ".join(sorted(ignored)))

    settings = GenerationSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, presence_penalty=presence,
        frequency_penalty=frequency, seed=None if req.seed is None else int(req.seed),
        logit_bias=bias, logprobs=host_logprobs, grammar=grammar_string, grammar_triggers=triggers,
        samplers=samplers, preset=web_ui.get("preset"), max_tokens_second=web_ui.get("max_tokens_second"))
    return Plan(settings=settings, n=n, best_of=best_of, stream=stream,
                include_usage=include_usage, logprobs=logprobs, echo=bool(getattr(req, "echo", False)), stops=stops,
                ignored=sorted(ignored))


def _openai_samplers(req: CompletionRequest | ChatCompletionRequest, preset: bool,
                     sent: set[str]) -> tuple[float | None, float | None, float | None, float | None]:
    """temperature, top_p, presence and frequency penalty: OpenAI's defaults where the request
    names none; with a web UI preset, None (the preset's) for those it does not name."""
    def sampler(name: str, value: float | None, default: float) -> float | None:
        if preset and name not in sent:
            return None
        return default if value is None else float(value)
    return (sampler("temperature", req.temperature, 1.0), sampler("top_p", req.top_p, 1.0),
            sampler("presence_penalty", req.presence_penalty, 0.0),
            sampler("frequency_penalty", req.frequency_penalty, 0.0))


def _length(req: CompletionRequest | ChatCompletionRequest, room: int, default_max_tokens: int) -> int:
    """The tokens to generate: what the request asks, within the ``room`` the context has left.
    A chat reply that names none gets the room (capped by the default_max_tokens setting), a
    completion OpenAI's 16."""
    wanted = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        wanted = req.max_completion_tokens
    if wanted is None:
        chat = isinstance(req, ChatCompletionRequest)
        wanted = (min(room, default_max_tokens) if default_max_tokens > 0 else room) if chat else 16
    return max(0, min(wanted, room))


def _choices(req: CompletionRequest | ChatCompletionRequest, abilities: HostAbilities, max_n: int) -> tuple[int, int]:
    """(n, best_of): the choices returned, and the candidates generated (only completions may
    ask for more than they return), each within max_n."""
    n = req.n or 1
    if n > max_n:
        raise _reject("n", f"n is {n}, above this server's limit of {max_n} (the max_n setting).")
    if not isinstance(req, CompletionRequest):
        return n, n
    best_of = req.best_of if req.best_of else n
    if best_of < n:
        raise _reject("best_of", f"best_of ({best_of}) must be at least n ({n}).")
    if best_of > max_n:
        raise _reject("best_of", f"best_of is {best_of}, above this server's limit of {max_n} (the max_n setting).")
    if best_of > n:
        if req.stream:
            raise _reject("best_of", "best_of above n cannot be streamed; set stream to false.")
        if not abilities.logprobs:
            raise _reject("best_of", "best_of above n needs log-probabilities, which this backend cannot report.")
    if req.suffix and not abilities.fim:
        raise _reject("suffix", "The loaded model has no fill-in-the-middle tokens, so suffix cannot be used; remove it.")
    return n, best_of


def _logit_bias(req: CompletionRequest | ChatCompletionRequest, abilities: HostAbilities) -> dict[int, float]:
    """logit_bias as token id -> bias, each key checked against the model's vocabulary."""
    if not req.logit_bias:
        return {}
    if not abilities.logit_bias:
        raise _reject("logit_bias", "logit_bias is not supported by the loaded model's backend; remove it.")
    for key in req.logit_bias:
        if not key.lstrip("-").isdigit() or int(key) < 0 or (
                abilities.vocab_size is not None and int(key) >= abilities.vocab_size):
            limit = f" 0..{abilities.vocab_size - 1}" if abilities.vocab_size else ""
            raise _reject("logit_bias", f"logit_bias key {key!r} is not a token id of the loaded model{limit}.")
    return {int(k): float(v) for k, v in req.logit_bias.items()}


def _logprobs(req: CompletionRequest | ChatCompletionRequest, abilities: HostAbilities) -> int | None:
    """The alternatives per token the client asked to see (None: no log-probabilities)."""
    logprobs: int | None = None
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise _reject("top_logprobs", "top_logprobs needs logprobs: true.")
        if req.logprobs:
            logprobs = req.top_logprobs or 0
    elif req.logprobs is not None:
        logprobs = req.logprobs
    if logprobs is not None:
        if not abilities.logprobs:
            raise _reject("logprobs", "The loaded model's backend cannot report log-probabilities; remove logprobs.")
        if getattr(req, "echo", False) and not abilities.scores_prompts:
            raise _reject("echo", "The loaded model's backend reports log-probabilities while generating but cannot "
                                  "score a prompt; remove echo or logprobs.")
    return logprobs


def _host_samplers(req: CompletionRequest | ChatCompletionRequest, extra: dict[str, Any], abilities: HostAbilities,
                   ignored: list[str]) -> dict[str, Any]:
    """The host's own samplers among the request's ``extra`` fields, checked and coerced; the web
    UI's fields are left to webui_fields, and any other extra field joins ``ignored``: the request
    model (an ApiModel) let it pass because the allow_unknown_fields setting is on."""
    samplers: dict[str, Any] = {}
    for name, value in extra.items():
        if name in HOST_SAMPLERS:
            if name not in abilities.samplers:
                raise _reject(name, f"{name} is not a sampler of the loaded model's backend; remove it.")
            if name == "sampler_priority" and isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = "\n".join(value)   # the web UI takes a list or one name a line
            samplers[name] = _coerce(name, value, HOST_SAMPLERS[name])
            if name == "custom_token_bans":
                samplers[name] = _token_bans(value, abilities)
        elif name in ignored:
            pass  # an OpenAI parameter that only has a rule, already listed
        elif name in webui_fields.ALL and name in type(req).passes and (
                isinstance(req, ChatCompletionRequest) or name in webui_fields.GENERATION_FIELDS):
            continue   # read by webui_fields (prompt fields by chat.template_input)
        else:
            ignored.append(name)   # truncation_length, enable_thinking of a completion, or allowed unknown
    return samplers


def _check_chat_switches(req: ChatCompletionRequest) -> None:
    if req.audio is not None:
        raise _reject("audio", "This model produces text only; remove audio.")
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise _reject("modalities", "This model produces text only; use modalities: ['text'].")
    if req.web_search_options is not None:
        raise _reject("web_search_options", "Web search is not available on this server; remove web_search_options.")


def _response_schema(rf: dict[str, Any] | None) -> Any | None:
    """The JSON Schema response_format asks for, or None for plain text."""
    if rf is None:
        return None
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar.JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _reject("response_format.json_schema", "json_schema needs an object with at least a 'name' "
                                                         "(and usually a 'schema').")
        return spec.get("schema", grammar.JSON_OBJECT_SCHEMA)
    raise _reject("response_format.type", f"{{param}} {kind!r} is not one of text, json_object, json_schema.")


def _constraints(req: ChatCompletionRequest, ts: ToolSet | None,
                 abilities: HostAbilities) -> tuple[str, tuple[str, ...]] | None:
    """The grammar response_format and tool_choice ask for, with its triggers (lazy: none
    applies before one of them), or None."""
    rf = req.response_format or {}
    schema = _response_schema(req.response_format)
    named = schema is not None and rf.get("type") == "json_schema"
    where = "response_format.json_schema.schema" if named else "response_format"
    # strict: true keeps every keyword the grammar cannot enforce a 400, as OpenAI refuses them;
    # a non-strict schema is enforced as far as the grammar can
    strict = named and rf["json_schema"].get("strict") is True
    if ts is None or not ts.calling:
        ts = None
    if ts is not None and ts.forced:
        if not abilities.grammar:
            err = _reject("tool_choice", "The loaded model's backend cannot constrain output with a grammar, so "
                                         "{param} {required} or a named function cannot be guaranteed.")
            err.words["required"] = "'required'"   # (Messages: 'any')
            raise err
        return tools.call_grammar(ts, prefilled=bool(ts.prefill)), ()
    if ts is not None and schema is not None:
        # auto with a response format: one grammar allows either calls or the JSON answer
        if not abilities.grammar:
            raise _reject("response_format", "The loaded model's backend cannot constrain output with a grammar, "
                                             "so JSON output cannot be guaranteed; remove {param}.")
        return tools.call_grammar(ts, response=(schema, where, strict)), ()
    if ts is not None:
        if not abilities.lazy_grammar:
            return None
        # The host writes freely until the model opens a call, then follows the grammar.
        return tools.call_grammar(ts, lazy=True), (tools.CALL_OPEN,)
    if schema is not None:
        if not abilities.grammar:
            raise _reject("response_format", "The loaded model's backend cannot constrain output with a grammar, "
                                             "so JSON output cannot be guaranteed; remove {param}.")
        return grammar.schema_to_gbnf(schema, where=where, strict=strict), ()
    return None


def _token_bans(value: str, abilities: HostAbilities) -> str:
    """The web UI's comma-separated token ids, checked: a bad id is the client's mistake."""
    ids = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        if not part.isdigit() or (abilities.vocab_size is not None and int(part) >= abilities.vocab_size):
            limit = f" 0..{abilities.vocab_size - 1}" if abilities.vocab_size else ""
            raise _reject("custom_token_bans", f"custom_token_bans holds {part!r}, which is not a token id of the "
                                               f"loaded model{limit}. Send comma-separated token ids, e.g. \"42,1337\".")
        ids.append(str(int(part)))
    return ",".join(ids)


def _coerce(name: str, value: Any, kind: type) -> Any:
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else
          isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, str))
    if not ok:
        raise _reject(name, f"{name} must be {'a' if kind is not int else 'an'} {kind.__name__}.")
    return kind(value)


def markdown_table() -> str:
    """The README's parameter table, generated from RULES."""
    return rules.markdown_table(RULES, (("Parameter", "name"), ("Endpoint", "endpoint"), ("What happens", "action"),
                                        ("Host setting", "target"), ("Notes", "note")))
