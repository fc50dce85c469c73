"""Attributes on vector store files and the search filters that read them (the spec's
ComparisonFilter and CompoundFilter, nested to any depth).

A comparison whose key a file lacks, or whose value is of another type than the file's (a number
against a string), does not hold, except ``ne`` and ``nin``, which hold: the file is not equal to
the value. Numbers and booleans compare as the JSON values they are (``true`` is not ``1``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def check_attributes(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError(f"attributes has {len(value)} keys; at most 16 are allowed.")
    for key, item in value.items():
        if len(key) > 64:
            raise ValueError(f"the attribute key {key[:70]!r} is longer than 64 characters.")
        if isinstance(item, str) and len(item) > 512:
            raise ValueError(f"the attribute {key!r} is longer than 512 characters.")
        if not isinstance(item, (str, int, float, bool)):
            raise ValueError(f"the attribute {key!r} is {type(item).__name__}; values are strings, numbers or "
                             "booleans.")
    return value


Attributes = Annotated[dict[str, Union[bool, int, float, str]] | None, AfterValidator(check_attributes)]


class Comparison(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"] = "eq"
    key: str
    value: Union[bool, int, float, str, list[Union[int, float, str]]]


class Compound(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["and", "or"]
    filters: list[Annotated[Union[Comparison, "Compound"], Field(union_mode="left_to_right")]]


MAX_DEPTH = 16   # compound filters nested at most this deep


def _depth(f: Comparison | Compound) -> int:
    return 1 + max((_depth(inner) for inner in f.filters), default=0) if isinstance(f, Compound) else 1


def _shallow(f: Comparison | Compound) -> Comparison | Compound:
    if _depth(f) > MAX_DEPTH:
        raise ValueError(f"filters are nested more than {MAX_DEPTH} deep; flatten them (and of ands is one and).")
    return f


Filter = Annotated[Union[Compound, Comparison], Field(union_mode="left_to_right"), AfterValidator(_shallow)]


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: a boolean equals only a boolean."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _ordered(a: Any, b: Any) -> bool:
    number = (int, float)
    both_numbers = isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) \
        and not isinstance(b, bool)
    return both_numbers or (isinstance(a, str) and isinstance(b, str))


def holds(f: Comparison | Compound, attributes: dict[str, Any] | None) -> bool:
    if isinstance(f, Compound):
        results = (holds(inner, attributes) for inner in f.filters)
        return all(results) if f.type == "and" else any(results)
    attributes = attributes or {}
    if f.key not in attributes:
        return f.type in ("ne", "nin")
    have, want = attributes[f.key], f.value
    if f.type in ("in", "nin"):
        found = any(_same(have, w) for w in (want if isinstance(want, list) else [want]))
        return found if f.type == "in" else not found
    if f.type == "eq":
        return _same(have, want)
    if f.type == "ne":
        return not _same(have, want)
    if not _ordered(have, want):
        return False
    return {"gt": have > want, "gte": have >= want, "lt": have < want, "lte": have <= want}[f.type]
