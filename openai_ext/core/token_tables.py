"""OpenAI's token tables, offline: cl100k_base ids back to text, and o200k_base counts.

Clients such as LangChain's OpenAIEmbeddings tokenize with tiktoken and send token ids; a local
embedding model has its own tokenizer, so the ids are decoded to text first. Speech reports its
input in o200k_base tokens, as OpenAI's speech models count them. ``bpe-openai`` carries the
tables (tiktoken downloads them at run time, which cannot work offline).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

from .errors import InvalidRequestError, ServiceUnavailableError
from .lazy import Lazy

ENCODING = "cl100k_base"   # the encoding of text-embedding-ada-002 and text-embedding-3-*


def load_encoding(name: str = ENCODING) -> Any:
    # bpe_openai reads its tables with a deprecated importlib call, on import and on first use
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai
        except ImportError:
            raise ServiceUnavailableError(f"Token-id input needs the {name} tables: pip install bpe-openai "
                                          "(or send the text itself).") from None
        return bpe_openai.get_encoding(name)


def o200k_counter() -> Callable[[str], int]:
    """Counts with o200k_base (the encoding of gpt-4o-mini-tts) when bpe-openai is installed, else
    with the usual estimate of four characters a token."""
    try:
        encoding = load_encoding("o200k_base")
    except ServiceUnavailableError:
        return lambda text: max(1, math.ceil(len(text) / 4))
    return lambda text: len(encoding.encode(text))


class TokenTables:
    """The tables, each loaded on first use and then shared by every family."""

    def __init__(self) -> None:
        self.cl100k: Lazy[Any] = Lazy(load_encoding, ENCODING)
        self.o200k_count: Lazy[Callable[[str], int]] = Lazy(o200k_counter, "o200k_base")


def decode(encoding: Any, arrays: Sequence[Sequence[int]], params: Sequence[str]) -> list[str]:
    """Each token-id array as text; ``params`` names each array for errors ("input", "input[2]").
    An id outside cl100k_base gets a 400 that says where it is."""
    out = []
    for ids, where in zip(arrays, params, strict=True):
        for j, token in enumerate(ids):
            # negative ids must be refused here: the decoder would read them from the end of its table
            if token < 0 or token >= encoding.n_vocab:
                raise _bad_token(where, j, token, encoding)
        try:
            out.append(encoding.decode(list(ids)))
        except KeyError:
            bad = next(j for j, t in enumerate(ids) if not _defined(encoding, t))
            raise _bad_token(where, bad, ids[bad], encoding) from None
    return out


def _defined(encoding: Any, token: int) -> bool:
    try:
        encoding.decode_single_token_bytes(token)
        return True
    except KeyError:
        return False


def _bad_token(where: str, j: int, token: int, encoding: Any) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid token id {token} at {where}[{j}]: token-id input is read as {ENCODING} ids "
        f"(0 to {encoding.n_vocab - 1}, the encoding of OpenAI's embedding models). "
        "Send text, or ids of that encoding.",
        param=where)
