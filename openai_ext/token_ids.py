"""OpenAI token ids (cl100k_base) back to text, offline.

Clients such as LangChain's OpenAIEmbeddings tokenize with tiktoken and send token ids; a local
embedding model has its own tokenizer, so the ids are decoded to text first. ``bpe-openai``
carries the tables (tiktoken downloads them at run time, which cannot work offline).
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from .errors import InvalidRequestError, ServiceUnavailableError

ENCODING = "cl100k_base"   # the encoding of text-embedding-ada-002 and text-embedding-3-*


def load_encoding() -> Any:
    # bpe_openai reads its tables with a deprecated importlib call, on import and on first use
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai
        except ImportError:
            raise ServiceUnavailableError("Token-id input needs the cl100k_base tables: pip install bpe-openai "
                                          "(or send the text itself).") from None
        return bpe_openai.get_encoding(ENCODING)


def decode(encoding: Any, arrays: Sequence[Sequence[int]], params: Sequence[str]) -> list[str]:
    """Each token-id array as text; ``params`` names each array for errors ("input", "input[2]").
    An id outside cl100k_base gets a 400 that says where it is."""
    out = []
    for ids, where in zip(arrays, params):
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
