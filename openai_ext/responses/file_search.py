"""Responses' ``file_search`` tool: the model searches the request's vector stores, this server runs
the search, and the model answers from what it found, citing the files.

1. The tool is offered to the model as a function (``file_search``, its argument one query:
   a list of strings is more than small local models write reliably, and a bigger model's several
   questions make one query as well); ``tool_choice: {"type": "file_search"}`` forces it. The
   user's latest question is searched beside the model's query (both are the item's ``queries``),
   so a small model's poor query still finds what the user asked about. A function of the client's with
   that name is a 400: the model could not tell the two apart.
2. A call the model makes becomes a ``file_search_call`` item (``response.file_search_call.*``
   events: in_progress, searching, completed), run here through the vector stores' search (the
   same ranking, filters and ownership as /v1/vector_stores/{id}/search), its results kept on the
   item. The model goes on from them (stream.py), as after an MCP call, until it answers.
3. The results are shown to the model numbered and named by file, and it is asked to cite a file
   by its name in square brackets; each name of a found file that the answer writes becomes a
   ``file_citation`` annotation on its output_text (index: where the citation ends).
4. The Response shows the results only with ``include: ["file_search_call.results"]``, as OpenAI
   does; the item's queries always.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from ..core.admission import Place
from ..core.errors import InvalidRequestError, OpenAIError, from_validation_errors
from ..vector_stores.requests import FileSearchTool
from .item_types import FileCitation, FileSearchCallItem, FileSearchResult, OutputTextPart
from .items import new_id, text_of

log = logging.getLogger(__name__)

NAME = "file_search"
INCLUDE = "file_search_call.results"
DESCRIPTION = ("Search the user's uploaded files for passages relevant to the question. Send a short search "
               "query. Answer from the passages found, and cite the file each fact comes from by its file "
               "name in square brackets, like [report.pdf].")
PARAMETERS = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 300}},
              "required": ["query"], "additionalProperties": False}
RESULT_CHARS = 12000   # the most text of results one call shows the model (the item keeps them whole)

class Searcher(Protocol):
    """The vector stores' side (vector_stores/service.py)."""

    async def check_stores(self, store_ids: list[str], owner: str, param: str) -> None:
        """A 404 naming the first store the owner has not (or a 400 if it has expired)."""

    async def search_tool(self, tool: FileSearchTool, queries: list[str], owner: str) -> list[dict[str, Any]]:
        """The results of ``queries`` in the tool's stores, as /search gives them."""


def declared(tools: list[Any] | None) -> tuple[int, FileSearchTool] | None:
    """The request's file_search tool, checked (a 400 naming the field otherwise), and where it is."""
    found = None
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != NAME:
            continue
        if found is not None:
            raise InvalidRequestError(f"tools[{i}] is a second file_search tool; send one, with every vector store "
                                      "in its vector_store_ids.", param=f"tools[{i}]")
        try:
            found = (i, FileSearchTool.model_validate(tool))
        except ValidationError as e:
            raise from_validation_errors([{**err, "loc": ("tools", i, *err["loc"])} for err in e.errors()]) from None
    return found


@dataclass
class Search:
    """What a response needs to run file searches: the tool, who asks (whose stores it may read),
    the search itself, and the calls run so far."""
    tool: FileSearchTool
    owner: str
    searcher: Searcher
    limit: int
    show_results: bool
    question: str = ""            # the user's latest message, searched beside the model's queries
    ran: int = 0
    found: dict[str, FileSearchResult] = field(default_factory=dict)   # file id -> a result of this response's

    def shown(self, item: FileSearchCallItem) -> FileSearchCallItem:
        """The item as the Response shows it (results only when included)."""
        return item if self.show_results or item.get("results") is None else {**item, "results": None}


def call_item() -> FileSearchCallItem:
    return FileSearchCallItem(id=new_id("fs"), type="file_search_call", status="in_progress", queries=[],
                              results=None)


def queries_of(arguments: str, question: str = "") -> list[str]:
    """The model's query (``query``, or OpenAI's ``queries`` where a client's history has them),
    and the user's question beside it."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = {}
    wanted = [value.get("query"), *(value.get("queries") or [])] if isinstance(value, dict) else []
    out: list[str] = []
    for q in [*wanted, question]:
        if isinstance(q, str) and q.strip() and q.strip() not in out:
            out.append(q.strip())
    return out


async def run_calls(turn: Any, calls: list[tuple[int, FileSearchCallItem]],
                    place: Place) -> AsyncGenerator[dict[str, Any], None]:
    """Runs the searches the model asked for, each item's progress and end as events. While a
    search runs, the response's generation slot serves others (``place.aside``)."""
    search: Search = turn.search
    for index, item in calls:
        where = {"item_id": item["id"], "output_index": index}
        if not item["queries"] or search.ran >= search.limit:
            item["status"] = "failed"
            item["results"] = []
        else:
            search.ran += 1
            item["status"] = "searching"
            yield turn.event("response.file_search_call.searching", **where)
            try:
                async with place.aside():
                    results = await search.searcher.search_tool(search.tool, item["queries"], search.owner)
            except OpenAIError as e:   # (a store removed or expired since the request began): the model is told
                log.warning("file_search %s failed: %s", item["id"], e.message)
                item["status"], item["results"] = "failed", []
                yield turn.event("response.output_item.done", output_index=index, item=search.shown(item.copy()))
                continue
            shown = [FileSearchResult(file_id=r["file_id"], filename=r["filename"], score=r["score"],
                                      attributes=r["attributes"], text="\n".join(c["text"] for c in r["content"]))
                     for r in results]
            item["results"] = shown
            for r in shown:
                search.found.setdefault(r["file_id"], r)
            item["status"] = "completed"
            yield turn.event("response.file_search_call.completed", **where)
        yield turn.event("response.output_item.done", output_index=index, item=search.shown(item.copy()))


def for_model(item: FileSearchCallItem) -> str:
    """A file_search_call's results as the model reads them."""
    results = item.get("results")
    if results is None:
        return "The search ran; its results are not kept."
    if not results:
        return "Nothing was found." if item.get("status") == "completed" else "The search could not run."
    out, left = [], RESULT_CHARS
    for n, r in enumerate(results, 1):
        text = r["text"][:left]
        out.append(f"[{r['filename']}] (result {n}, score {r['score']:.2f})\n{text}")
        left -= len(text)
        if left <= 0:
            break
    return "\n\n".join(out)


def arguments_of(item: FileSearchCallItem) -> str:
    queries = item.get("queries") or []
    return json.dumps({"query": queries[0] if queries else ""})


def citations(text: str, found: dict[str, FileSearchResult]) -> list[FileCitation]:
    """A file_citation for each place the text names a file the searches found (``[name]``, or the
    name itself standing as a word), in the order they come. Names are matched in one pass, the
    longest first, so a name inside a longer one is not cited too; a name two files share cites
    the one that scored best."""
    best: dict[str, tuple[float, str]] = {}
    for file_id, result in found.items():
        name = result["filename"]
        if name and (name not in best or result["score"] > best[name][0]):
            best[name] = (result["score"], file_id)
    if not best:
        return []
    names = "|".join(re.escape(n) for n in sorted(best, key=len, reverse=True))
    pattern = re.compile(rf"\[({names})\]|(?<![\w./-])({names})(?![\w/-]|\.\w)")
    return [{"type": "file_citation", "file_id": best[m.group(1) or m.group(2)][1],
             "filename": m.group(1) or m.group(2), "index": m.end()} for m in pattern.finditer(text)]


def cite(turn: Any, part: OutputTextPart, where: dict[str, Any]) -> list[dict[str, Any]]:
    """Annotates an output_text part that is done with the files it cites; their events."""
    search: Search | None = turn.search
    if search is None or not search.found:
        return []
    part["annotations"] = [*citations(part["text"], search.found)]
    return [turn.event("response.output_text.annotation.added", **where, content_index=0, annotation_index=n,
                       annotation=a) for n, a in enumerate(part["annotations"])]


async def check(tools: list[Any] | None, owner: str, searcher: Searcher | None) -> None:
    """Before the response begins: the tool's stores exist, and the caller may search them."""
    found = declared(tools)
    if found is not None and searcher is not None:
        await searcher.check_stores(found[1].vector_store_ids, owner, f"tools[{found[0]}].vector_store_ids")


def attach(turn: Any, body: Any, owner: str, searcher: Searcher | None, limit: int) -> bool:
    """Gives the turn its file_search tool, if the request has one; whether it has."""
    declared_ = declared(body.tools)
    if declared_ is None:
        return False
    if searcher is None:
        raise InvalidRequestError("file_search needs the server's vector stores, which this server does not have.",
                                  param=f"tools[{declared_[0]}]")
    shown = INCLUDE in (body.include or [])
    asked = [it for it in turn.record.input if it["type"] == "message" and it["role"] == "user"]
    turn.search = Search(declared_[1], owner, searcher, limit, show_results=shown,
                         question=text_of(asked[-1])[:2000] if asked else "")
    turn.state.search_results = shown
    return True


def bad_choice(where: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where} picks file_search, which no tool of this request offers; add a file_search "
                               "tool with the vector_store_ids to search.", param=where)
