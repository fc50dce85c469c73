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

Status = Literal["in_progress", "completed", "incomplete"]


# Content parts -----------------------------------------------------------------------------------
class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class Logprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class FileCitation(TypedDict):
    """What this server annotates: a file the answer cites (file_search.py); index: where the
    citation ends."""
    type: Literal["file_citation"]
    file_id: str
    filename: str
    index: int


class UrlCitation(TypedDict):
    type: Literal["url_citation"]
    url: str
    title: str
    start_index: int
    end_index: int


class ContainerFileCitation(TypedDict):
    type: Literal["container_file_citation"]
    container_id: str
    file_id: str
    filename: str
    start_index: int
    end_index: int


class FilePath(TypedDict):
    type: Literal["file_path"]
    file_id: str
    index: int


# (a client's assistant messages sent back keep their annotations and logprobs as sent, unchecked)
Annotation = Union[FileCitation, UrlCitation, ContainerFileCitation, FilePath]


class InputTextPart(TypedDict):
    type: Literal["input_text"]
    text: str


class OutputTextPart(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Annotation]
    logprobs: list[Logprob]


class RefusalPart(TypedDict):
    type: Literal["refusal"]
    refusal: str


class InputImagePart(TypedDict):
    """An image as it is stored (images.py): always a data URL, never a file_id."""
    type: Literal["input_image"]
    image_url: str
    file_id: str | None
    detail: str


# A message's part (and a function output's: input_text and input_image)
ContentPart = Union[InputTextPart, OutputTextPart, RefusalPart, InputImagePart]


class SummaryTextPart(TypedDict):
    type: Literal["summary_text"]
    text: str


class ReasoningTextPart(TypedDict):
    type: Literal["reasoning_text"]
    text: str


# Items -------------------------------------------------------------------------------------------


class MessageItem(TypedDict):
    id: str
    type: Literal["message"]
    role: Literal["user", "assistant", "system", "developer"]
    status: Status
    content: list[ContentPart]
    phase: NotRequired[str]


class FunctionCallItem(TypedDict):
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: Status
    namespace: NotRequired[str]


class FunctionCallOutputItem(TypedDict):
    id: str
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    status: Status
    name: NotRequired[str]
    namespace: NotRequired[str]


class ReasoningItem(TypedDict):
    id: str
    type: Literal["reasoning"]
    summary: list[SummaryTextPart]
    content: NotRequired[list[ReasoningTextPart]]
    encrypted_content: NotRequired[str]
    status: NotRequired[Status]


class CompactionItem(TypedDict):
    id: str
    type: Literal["compaction"]
    encrypted_content: str
    created_by: NotRequired[str]
    status: NotRequired[Status]


class CompactionTriggerItem(TypedDict):
    """The last input item of a request that asks for a compaction here: taken off the input
    before anything is stored (it has no id then)."""
    type: Literal["compaction_trigger"]
    id: NotRequired[str]


class McpTool(TypedDict):
    """A tool an MCP server lists (mcp/client.py makes them; a client's sent back are kept as sent)."""
    name: str
    input_schema: dict[str, Any]
    description: NotRequired[str | None]
    annotations: NotRequired[dict[str, Any] | None]


class McpListToolsItem(TypedDict):
    id: str
    type: Literal["mcp_list_tools"]
    server_label: str
    tools: list[McpTool]
    error: NotRequired[str | None]


class McpProtocolError(TypedDict):
    type: Literal["mcp_protocol_error"]
    code: int
    message: str


class McpToolExecutionError(TypedDict):
    type: Literal["mcp_tool_execution_error"]
    content: Any


class HttpError(TypedDict):
    type: Literal["http_error"]
    code: int
    message: str


# An mcp_call's error (OpenAI's MCPToolCallError); a client may send it back as a plain string
McpError = Union[McpProtocolError, McpToolExecutionError, HttpError]


class McpCallItem(TypedDict):
    id: str
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    status: NotRequired[Literal["in_progress", "completed", "incomplete", "calling", "failed"]]
    output: NotRequired[str | None]
    error: NotRequired[McpError | str | None]
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


class FileSearchResult(TypedDict):
    """A passage a search found (file_search.py); the Response shows them only when included."""
    file_id: str
    filename: str
    score: float
    attributes: dict[str, str | float | bool] | None
    text: str


class FileSearchCallItem(TypedDict):
    id: str
    type: Literal["file_search_call"]
    status: Literal["in_progress", "searching", "completed", "incomplete", "failed"]
    queries: list[str]
    results: NotRequired[list[FileSearchResult] | None]


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
