"""Config values as a search space sees them: comparing a value with a declared one
(``1`` is ``1.0`` but never ``True``), and naming a value's kind for error messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

Scalar = Union[str, bool, int, float]  # noqa: UP007 - pydantic tries members in order


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same value: equal and of one type, or both non-bool numbers."""
    return (type(a) is type(b) and a == b) or (
        isinstance(a, int | float)
        and isinstance(b, int | float)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


def matches(value: Any, allowed: Any) -> bool:
    """``value`` is ``allowed`` or one of the list ``allowed`` (a ``when:`` condition)."""
    return any(same(value, a) for a in (allowed if isinstance(allowed, list) else [allowed]))


def kind_of(value: Any) -> str:
    """The YAML kind of a config value: null, bool, int, float, str, mapping, list."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def family(kind: str) -> str:
    """Kinds one config key may switch between: int and float are both numbers."""
    return "number" if kind in ("int", "float") else kind
