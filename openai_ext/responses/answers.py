"""Calls and their answers: every output answers a call made before it, every call is answered
before the conversation goes on, and every MCP approval response answers a request, as OpenAI
requires. Read over the items before a request and its new ones."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import InvalidRequestError
from . import compacted
from .item_types import CompactionItem, Item


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def check_call_outputs(history: Sequence[Item], items: Sequence[Item], where: str = "input", *,
                       answered: bool = True) -> None:
    """Every function_call_output answers a function_call made before it, as OpenAI requires: in
    the history, earlier in ``items``, or kept by the latest compaction item before it (which
    stands for everything before it). A compaction's content is read only for an output that no
    call answers otherwise. ``answered``: and every function_call is answered (check_answered)."""
    if answered:
        check_answered(history, items, where)
    calls = {it["call_id"] for it in history if it["type"] == "function_call"}
    latest = next((it for it in reversed(history) if it["type"] == "compaction"), None)
    kept: dict[int, set[str]] = {}

    def kept_calls(item: CompactionItem) -> set[str]:
        if id(item) not in kept:
            kept[id(item)] = {k["call_id"] for k in compacted.decode(item["encrypted_content"], where)[1]
                              if isinstance(k, dict) and k.get("type") == "function_call"
                              and isinstance(k.get("call_id"), str)}
        return kept[id(item)]

    for i, it in enumerate(items):
        if it["type"] == "compaction":
            latest = it
        elif it["type"] == "function_call":
            calls.add(it["call_id"])
        elif it["type"] == "function_call_output" and it["call_id"] not in calls and (
                latest is None or it["call_id"] not in kept_calls(latest)):
            raise _bad(f"{where}[{i}].call_id", f"No tool call found for function call output with call_id "
                                                f"'{it['call_id']}'. Send the function_call item before its output, "
                                                "or continue from the response that made it (previous_response_id "
                                                "or conversation).")


def check_answered(history: Sequence[Item], items: Sequence[Item], where: str = "input") -> None:
    """Every function_call is answered by its function_call_output before the conversation goes
    on, as OpenAI requires ("No tool output found for function call ..."): before the next user,
    system or developer message, and, once the input answers some of the calls it ends with, all
    of them. A compaction item stands for everything before it, and calls the history left
    unanswered before a later message of its own are its own: only ``items`` are refused. Calls
    the input ends with, with nothing but the model's own items after them, are left as they are,
    and so are incomplete ones (cut by max_output_tokens: the client could not run them)."""
    pending: dict[str, int] = {}     # call id -> its place, for calls waiting for their output
    last_output = -1                 # the place of the input's last function_call_output

    def refuse(param: str, before: str) -> InvalidRequestError:
        first, *others = pending
        also = f" Nor for {', '.join(others)}." if others else ""
        return _bad(param, f"No tool output found for function call {first}.{also} Send a function_call_output "
                           f"item with its call_id (the tool's result, or an error text) for each call, {before}.")

    for k, it in enumerate([*history, *items]):
        i = k - len(history)       # the place in items (negative: the history's)
        if it["type"] == "function_call" and it.get("status") != "incomplete":   # a call max tokens cut is no call
            pending[it["call_id"]] = k
        elif it["type"] == "function_call_output":
            pending.pop(it["call_id"], None)
            last_output = k if i >= 0 else last_output
        elif it["type"] == "compaction":
            pending.clear()
        elif it["type"] == "message" and it.get("role") != "assistant" and pending:
            if i >= 0:
                continued = i == 0 and min(pending.values()) < len(history)
                raise refuse(f"{where}[{i}]", f"before {where}[{i}]" + (
                    " (the response this input continues from ended with these calls)" if continued else ""))
            pending.clear()
    if any(k < last_output for k in pending.values()):
        raise refuse(where, f"with the outputs {where} holds")


def check_approvals(before: Sequence[Item], new: Sequence[Item]) -> None:
    """Every mcp_approval_response answers an mcp_approval_request of the context, once."""
    requests = {it["id"] for it in [*before, *new] if it["type"] == "mcp_approval_request"}
    answered: set[str] = set()
    for i, it in enumerate(new):
        if it["type"] != "mcp_approval_response":
            continue
        rid = it["approval_request_id"]
        if rid not in requests:
            raise _bad(f"input[{i}].approval_request_id",
                       f"No MCP approval request found with id '{rid}'. Send the mcp_approval_request item before "
                       "its response, or continue from the response that made it (previous_response_id).")
        if rid in answered:
            raise _bad(f"input[{i}].approval_request_id", f"The MCP approval request '{rid}' is answered twice.")
        answered.add(rid)
