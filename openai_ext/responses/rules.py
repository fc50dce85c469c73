"""What happens to each parameter of POST /v1/responses: mapped onto the chat request that
``params.plan()`` turns into host settings, handled by this server, ignored by a documented rule,
or rejected with a 400 naming it. The README's table is generated from ``RULES``.

``check()`` applies the rejections that need no history or model; the rest of the mapping is
``convert.py``.
"""

from __future__ import annotations

import logging

from ..core import rules
from ..core.config import Settings
from ..core.errors import InvalidRequestError
from ..core.rules import Rule
from .protocol import CreateResponse

log = logging.getLogger(__name__)

R = "responses"

RULES: tuple[Rule, ...] = (
    Rule("model", R, "server", "-", "Any name is accepted. Standalone, a name from the catalog (models_dir, the models setting) gets that model, loaded on demand; any other name is served by the default model."),
    Rule("keep_alive", R, "server", "-", "Extension, as in chat: how long a catalog model named here stays loaded while idle (Ollama's keep_alive)."),
    Rule("input", R, "mapped", "messages", "A string (one user message) or items: messages (user, assistant, system, developer; a string or input_text / output_text parts), function_call (with its namespace, if any), function_call_output, item_reference, reasoning (kept, not shown to the model), compaction (from /v1/responses/compact or context_management: everything before the latest one is replaced by its summary and the items it kept), and compaction_trigger as the last item. input_image parts (data URLs) reach a vision model (loaded in the web UI, or standalone with its projector); without one, and for file_id, a 400 naming the part. input_file parts (file_id of an uploaded file, or file_data with its filename) are read as text (text, code, Markdown, JSON, HTML, PDF) and kept as input_text; file_url gets a 400. Audio parts get a 400, as in chat. file_search_call items are accepted and shown to the model."),
    Rule("instructions", R, "mapped", "messages", "A system message before the input. Not carried over by previous_response_id, as at OpenAI."),
    Rule("max_output_tokens", R, "mapped", "max_completion_tokens", "At least 16, as at OpenAI. Default: the rest of the context. Reaching it gives status incomplete, incomplete_details.reason max_output_tokens."),
    Rule("temperature", R, "mapped", "temperature", "Default 1; 0 is greedy decoding."),
    Rule("top_p", R, "mapped", "top_p", "Default 1."),
    Rule("presence_penalty", R, "mapped", "presence_penalty", "From Open Responses' request body (OpenAI's has not got it): -2 to 2, default 0, as in chat; echoed."),
    Rule("frequency_penalty", R, "mapped", "frequency_penalty", "As presence_penalty."),
    Rule("include", R, "mapped", "logprobs", "message.output_text.logprobs returns log-probabilities on output_text parts and text deltas; file_search_call.results shows the file_search_call items' results (without it they are null, as at OpenAI; the model reads them either way); the other values name outputs of hosted tools or encrypted reasoning, which are never produced, and are ignored."),
    Rule("top_logprobs", R, "mapped", "top_logprobs", "0-20 alternatives per token. Sent alone it also turns log-probabilities on."),
    Rule("tools", R, "mapped", "tools", "Function tools (strict true or false: the calls are validated against the parameters either way, and a grammar enforces them as in chat), and namespace tools: their functions are shown to the model under their own names (namespace__name where two share a name), and calls come back with name and namespace. mcp tools: remote MCP servers, whose tools this server lists, offers and runs (see Remote MCP tools). file_search tools: the vector stores named are searched here when the model calls the tool (see Vector stores and file_search). OpenAI's other hosted tools (web search, code interpreter, computer use, image generation, shell, apply_patch, tool search) get a 400 naming the tool, and so do custom (free-form) tools; but web_search with external_web_access false (Codex CLI's default), which may search only cached pages and this server has none, is accepted and not offered to the model."),
    Rule("tool_choice", R, "mapped", "tool_choice", "none, auto, required, {type: function, name}, {type: mcp, server_label, name} (no name: one of that server's tools; a forced MCP call applies to the first pass), {type: file_search} (forces a search on the first pass), or allowed_tools. A namespace's function is named by its own name (with namespace where two namespaces hold it) or by the name the model sees. A hosted tool type gets a 400."),
    Rule("parallel_tool_calls", R, "mapped", "parallel_tool_calls", "Default true. false: at most one call. Passed on only when there are tools."),
    Rule("max_tool_calls", R, "server", "-", "0: no calls (tool_choice none); 1: as parallel_tool_calls false; N: calls after the N-th are dropped. With mcp tools, also the most MCP calls the response runs (when lower than mcp_max_calls)."),
    Rule("text.format", R, "mapped", "response_format", "text, json_object, json_schema (name, schema, strict), enforced by the same grammar as chat's response_format."),
    Rule("text.verbosity", R, "ignored", "-", "No equivalent sampler; echoed."),
    Rule("reasoning", R, "mapped", "reasoning_effort", "effort is chat's reasoning_effort (extension mode: handed to the model's chat template; standalone: ignored); summary is echoed. A reasoning model's thinking, split off by the host (the web UI's splitter in extension mode, <think> tags standalone), comes back as a reasoning item with reasoning_text content ahead of the message, streamed as response.reasoning_text.delta; a model without a reasoning mode gives none. reasoning_tokens stays 0: the host counts the reply's tokens as one."),
    Rule("store", R, "server", "-", "Default true: the response and its input items are kept in the store. false (or the responses_store setting off): nothing is kept, and a later reference to the response is a 404 previous_response_not_found, except on the WebSocket that made it, which keeps its latest response in memory for a continuation."),
    Rule("previous_response_id", R, "server", "-", "Continues from a stored response: its input and output items (and those it continued from) come before this input."),
    Rule("conversation", R, "server", "-", "A conversation id (or {id}): its items come before this input, and this turn's input and output items are appended to it. Not with previous_response_id."),
    Rule("background", R, "server", "-", "Answers at once with status queued; the response runs in line, polled with GET and stopped with POST /cancel. Needs store. Not over the WebSocket (an error event)."),
    Rule("stream", R, "server", "-", "Server-sent events with event: and data: lines and an increasing sequence_number, ending with data: [DONE] (Open Responses). Over the WebSocket the events are text frames, and stream is implied."),
    Rule("stream_options", R, "ignored", "-", "include_obfuscation is accepted; delta events carry no obfuscation padding (OpenAI adds it against length side channels)."),
    Rule("truncation", R, "server", "-", "disabled (default): input longer than the context is a 400 context_length_exceeded. auto: the oldest input items are dropped until it fits. The truncate_prompt setting does not apply here."),
    Rule("metadata", R, "server", "-", "Up to 16 string pairs, stored and echoed."),
    Rule("user", R, "ignored", "-", "Echoed; nothing to do locally."),
    Rule("safety_identifier", R, "ignored", "-", "Echoed; nothing to do locally."),
    Rule("service_tier", R, "ignored", "-", "One local tier: responses say default."),
    Rule("prompt_cache_key", R, "ignored", "-", "The embedded host reuses the cached prefix of the previous prompt by itself; echoed."),
    Rule("prompt_cache_retention", R, "ignored", "-", "As prompt_cache_key."),
    Rule("prompt_cache_options", R, "ignored", "-", "As prompt_cache_key."),
    Rule("client_metadata", R, "ignored", "-", "Not in OpenAI's spec: Codex CLI sends it (string pairs about the client) with every request. Accepted and ignored; not echoed."),
    Rule("moderation", R, "ignored", "-", "Outputs are not moderated; call /v1/moderations yourself."),
    Rule("prompt", R, "rejected", "-", "Prompt templates are stored at OpenAI; there are none here: 400. Send instructions and input."),
    Rule("context_management", R, "server", "-", "[{type: compaction, compact_threshold}]: when the prompt passes the threshold (at least 1000 tokens; null or above the context: when it would not leave room for the answer), the loaded model first summarises the older items, the output starts with a compaction item standing for them, and the answer is generated from the compacted context; usage counts the summarising passes too. The newest items (up to half the threshold, never a call's output without its call) are kept word for word. An input ending with a compaction_trigger item is compacted whatever its size, and the response is the compaction alone."),
    Rule("host samplers", R, "mapped", "same name", "Extra fields named after the host's samplers (top_k, min_p, repetition_penalty ...), as in chat. Chat-only parameters (max_tokens, messages, stop, seed ...) get a 400 naming what to send instead."),
)

def _reject(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def check(body: CreateResponse, settings: Settings) -> list[str]:
    """Refuses what this server does not do; returns the sent parameters ignored by a rule."""
    if body.prompt is not None:
        raise _reject("prompt", "Prompt templates (prompt) are stored at OpenAI and cannot be used here; send "
                                "instructions and input instead.")
    if body.background and not body_stores(body, settings):
        why = "store is false" if settings.responses_store else "the responses_store setting is off on this server"
        raise _reject("background", f"background responses are stored to be polled, but {why}; remove background "
                                    "or turn storage on.")
    ignored = rules.ignored(RULES, body.model_fields_set)
    if ignored:
        log.debug("ignored response parameters: %s", ", ".join(ignored))
    return ignored


def body_stores(body: CreateResponse, settings: Settings) -> bool:
    """Whether this response is kept: store defaults to true, and the server may keep nothing."""
    return settings.responses_store and body.store is not False


def markdown_table() -> str:
    """The README's table of /v1/responses parameters, generated from RULES."""
    return rules.markdown_table(RULES, (("Parameter", "name"), ("What happens", "action"),
                                        ("Chat parameter", "target"), ("Notes", "note")))
