"""Reading the ``input`` of /v1/embeddings and /v1/moderations, with errors that say what is wrong."""

from __future__ import annotations

from typing import Any

from ..core.errors import InvalidRequestError

MAX_INPUTS = 2048        # OpenAI's limit on the items of one request
MAX_INPUT_TOKENS = 8192  # OpenAI's limit on one input given as token ids


def input_list(value: Any, shapes: str) -> list[Any]:
    """``value`` as a non-empty list of at most MAX_INPUTS items (a string is one item);
    ``shapes`` says what is accepted, for the 400."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequestError(f"'input' must be {shapes}.", param="input")
    if not value:
        raise InvalidRequestError("'input' cannot be an empty list. Send at least one text.", param="input")
    if len(value) > MAX_INPUTS:
        raise InvalidRequestError(f"'input' has {len(value)} items; at most {MAX_INPUTS} are allowed in one request. "
                                  "Split it over several requests.", param="input")
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tokens(ids: list[int], where: str) -> None:
    if len(ids) > MAX_INPUT_TOKENS:
        raise InvalidRequestError(f"'{where}' has {len(ids)} tokens; one input may have at most {MAX_INPUT_TOKENS} "
                                  "(OpenAI's limit). Split it.", param=where)


def embedding_input(value: Any) -> tuple[list[str], list[list[int]] | None, list[str]]:
    """(texts, None, []) for text input, or ([], token arrays, the name of each array for errors)
    for token-id input; 400 for anything else."""
    shapes = "a string, a list of strings, a list of token ids, or a list of token-id lists"
    if isinstance(value, str) and not value:
        raise InvalidRequestError("'input' cannot be an empty string. Send some text to embed.", param="input")
    if isinstance(value, list) and value and all(_is_int(x) for x in value):
        # one input given as token ids: its length is a token count, not a number of inputs
        _check_tokens(value, "input")
        return [], [value], ["input"]
    items = input_list(value, shapes)
    if all(isinstance(x, str) for x in items):
        for i, text in enumerate(items):
            if not text:
                raise InvalidRequestError(f"'input[{i}]' is an empty string; every input must hold some text.",
                                          param=f"input[{i}]")
        return list(items), None, []
    if all(isinstance(x, list) for x in items):
        for i, ids in enumerate(items):
            if not ids:
                raise InvalidRequestError(f"'input[{i}]' is an empty token list; every input must hold some tokens.",
                                          param=f"input[{i}]")
            if not all(_is_int(t) for t in ids):
                raise InvalidRequestError(f"'input[{i}]' must be a list of integer token ids.", param=f"input[{i}]")
            _check_tokens(ids, f"input[{i}]")
        return [], items, [f"input[{i}]" for i in range(len(items))]
    raise InvalidRequestError(f"'input' must be {shapes}; do not mix kinds in one list.", param="input")
