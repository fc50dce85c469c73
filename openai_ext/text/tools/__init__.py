"""Tool calling: OpenAI ``tools`` in, ``tool_calls`` out.

Wire format. Calls are written the way Hermes-style chat templates (Qwen2.5, Hermes, ...) teach
their models::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that knows this format renders the tools and the tool messages itself. Any other
template gets the documented fallback: the tool list and this format are described in a system
message, earlier calls are written into assistant messages in this format, and tool results are
given back as user messages wrapped in ``<tool_response>``.

Only templates that contain the ``<tool_call>`` marker count as knowing this format; a template
that renders tools in another format (Llama 3's JSON, Mistral's [TOOL_CALLS] ...) gets the
fallback, so the model is always taught the one format parsed here.

Guarantees. With ``tool_choice`` "required" or a named function, decoding follows a grammar built
from the functions' parameter schemas, so every call is well-formed and valid. With "auto", the
embedded host applies the same grammar from the moment the model writes the opening marker
(``grammar_triggers``); any call is then parsed and validated against its schema, and text that is
not a valid call is returned as content, never as a broken call. A non-strict function whose
schema the grammar enforces only in part (see grammar.rewrite) has its calls held until they are
complete and validated, even under a grammar. With ``parallel_tool_calls`` false, whatever follows
the first call is dropped.
"""

from .grammar import call_grammar, named_call_prefill
from .prompt import fallback_instructions, for_template, template_is_native
from .spec import CALL_CLOSE, CALL_OPEN, Tool, ToolSet, parse
from .stream import CallDelta, Content, ToolCallStream

__all__ = ["CALL_CLOSE", "CALL_OPEN", "CallDelta", "Content", "Tool", "ToolCallStream", "ToolSet", "call_grammar",
           "fallback_instructions", "for_template", "named_call_prefill", "parse", "template_is_native"]
