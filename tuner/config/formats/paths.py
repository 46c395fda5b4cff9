"""Dotted paths through a parsed config (any format), and value equality as a config means it.

A dotted path walks mappings by key and lists by integer index (``fusion.windows_days.1``).
Shared by every format module (tuner.config.formats) and by tuner.config.configpatch.

    MISSING; split_path(dotted); get_path(doc, dotted) -> value | MISSING
    all_paths(doc) -> list[str]; equal(old, new) -> bool; check_edits(again, edits, name, kind)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.errors import ConfigError


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def split_path(dotted: str) -> list[str | int]:
    """``"a.b.0"`` -> ``["a", "b", 0]``; integer segments index lists."""
    return [int(s) if s.isdigit() else s for s in dotted.split(".")]


def get_path(doc: Any, dotted: str) -> Any:
    """The value at ``dotted`` in ``doc``, or ``MISSING``."""
    node = doc
    for seg in split_path(dotted):
        if isinstance(node, Mapping):
            key: Any = seg if seg in node else str(seg)
            if key not in node:
                return MISSING
            node = node[key]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            node = node[seg]
        else:
            return MISSING
    return node


def all_paths(doc: Any, prefix: str = "") -> list[str]:
    """Every dotted path through nested mappings (for "did you mean" hints)."""
    out: list[str] = []
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            p = f"{prefix}{k}"
            out.append(p)
            out.extend(all_paths(v, p + "."))
    return out


def number_like(old: Any, new: Any) -> Any:
    """``new`` in ``old``'s number type, the rule of every format: an int stays an int, a
    float a float; a bool on either side is left as it is."""
    if isinstance(new, bool) or isinstance(old, bool):
        return new
    if isinstance(old, float) and isinstance(new, int):
        return float(new)
    if isinstance(old, int) and isinstance(new, float) and new.is_integer():
        return int(new)
    return new


def equal(old: Any, new: Any) -> bool:
    """The config's ``old`` value is ``new`` as written: numbers by value (``1`` is ``1.0``,
    never ``True``), strings and bools by value and kind, containers item by item."""
    if old is MISSING:
        return False
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return old.keys() == new.keys() and all(equal(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, Sequence) and not isinstance(new, str):
        return len(old) == len(new) and all(equal(a, b) for a, b in zip(old, new, strict=True))
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool) and old == new
    if isinstance(old, int | float) and isinstance(new, int | float):
        return bool(old == new)
    if isinstance(old, str) and isinstance(new, str):
        return str(old) == new
    return old is None and new is None


def check_edits(again: Any, before: Any, edits: Mapping[str, Any], name: str, kind: str) -> None:
    """The self-check of a patch: ``again`` (the patched text, parsed back by an independent
    parser) holds every edited value, and equals ``before`` everywhere else."""
    for dotted, value in edits.items():
        if not equal(get_path(again, dotted), value):
            raise ConfigError(
                f"{name}: {dotted}: the patched {kind} does not read back as {value!r}; the file was not written"
            )
    if _without(again, edits) != _without(before, edits):
        raise ConfigError(f"{name}: patching changed a value no edit names; the file was not written")


def _without(doc: Any, edits: Mapping[str, Any]) -> Any:
    """``doc`` (plain) with every edited path's value replaced by a marker."""
    import copy

    out = copy.deepcopy(doc)
    for dotted in edits:
        segs = split_path(dotted)
        node = get_path(out, ".".join(str(s) for s in segs[:-1])) if len(segs) > 1 else out
        leaf = segs[-1]
        if isinstance(node, dict):
            key: Any = leaf if leaf in node else str(leaf)
            if key in node:
                node[key] = "<edited>"
        elif isinstance(node, list) and isinstance(leaf, int) and 0 <= leaf < len(node):
            node[leaf] = "<edited>"
    return out
