"""The items of a response and of a conversation, typed: one shape per ``type`` (OpenAI's
``ItemResource`` members this server makes, reads and stores), told apart by ``type``.

They are TypedDicts, so an item is the plain JSON object that is stored, streamed and listed
(the bodies are the same bytes), and the type checker follows each shape through the store,
convert, stream and compaction: narrowing on ``item["type"] == "message"`` gives the message's
fields. Field names follow OpenAI's spec (and the openai SDK's ``types.responses`` models).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from typing_extensions import NotRequired, TypedDict

# A content part: input_text, output_text (with annotations and logprobs), refusal, input_image.
Part = dict[str, Any]
Status = Literal["in_progress", "completed", "incomplete"]


class MessageItem(TypedDict):
    id: str
    type: Literal["message"]
    role: Literal["user", "assistant", "system", "developer"]
    status: str
    content: list[Part]
    phase: NotRequired[str]


class FunctionCallItem(TypedDict):
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: NotRequired[str]


class FunctionCallOutputItem(TypedDict):
    id: str
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]
    status: str
    name: NotRequired[str]
    namespace: NotRequired[str]


class ReasoningItem(TypedDict):
    id: str
    type: Literal["reasoning"]
    summary: list[Part]
    content: NotRequired[list[Part]]
    encrypted_content: NotRequired[str]
    status: NotRequired[str]


class CompactionItem(TypedDict):
    id: str
    type: Literal["compaction"]
    encrypted_content: str
    created_by: NotRequired[str]
    status: NotRequired[str]


class CompactionTriggerItem(TypedDict):
    """The last input item of a request that asks for a compaction here: taken off the input
    before anything is stored (it has no id then)."""
    type: Literal["compaction_trigger"]
    id: NotRequired[str]


class McpListToolsItem(TypedDict):
    id: str
    type: Literal["mcp_list_tools"]
    server_label: str
    tools: list[dict[str, Any]]
    error: NotRequired[str | None]


class McpCallItem(TypedDict):
    id: str
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    status: NotRequired[str]
    output: NotRequired[str | None]
    error: NotRequired[dict[str, Any] | str | None]
    approval_request_id: NotRequired[str | None]


class McpApprovalRequestItem(TypedDict):
    id: str
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(TypedDict):
    id: str
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: NotRequired[str | None]


class FileSearchCallItem(TypedDict):
    id: str
    type: Literal["file_search_call"]
    status: str
    queries: list[str]
    results: NotRequired[list[dict[str, Any]] | None]


class SummaryItem(TypedDict):
    """What a compaction item stands for, in the context the model is shown (compaction.expand):
    its summary, before the items it kept. Never stored or sent (it has no id)."""
    type: Literal["compaction_summary"]
    text: str
    id: NotRequired[str]


Item = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem, CompactionItem,
             CompactionTriggerItem, McpListToolsItem, McpCallItem, McpApprovalRequestItem, McpApprovalResponseItem,
             FileSearchCallItem, SummaryItem]
Items = list[Item]
