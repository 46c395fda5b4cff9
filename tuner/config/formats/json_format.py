"""JSON config files: patched by replacing only the edited values' text.

The file is scanned once for the span (start and end offset) of every value; an edit
rewrites just the spans of the values it changes, so everything else stays byte for
byte: key order, indentation (2 / 4 spaces, tabs, one line), spacing, the trailing
newline, escapes and non-ASCII characters as written. A new value is written as its
type: an int stays an int (``60``), a float a float (``60.0``); a list or object of a
different length is laid out like the one it replaces (one line, or indented one step
deeper than its key's line). Only existing keys are patched (JSON has no comments).

    load(text, name) -> dict             # plain, key order kept
    patch(text, edits, name, verbatim=True) -> str
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.config.formats.paths import all_paths, check_edits, equal, get_path, number_like, split_path
from tuner.config.yamlfile import did_you_mean
from tuner.errors import ConfigError

KIND = "JSON"
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def load(text: str, name: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{name}: expected an object at the top level")
    return doc


def patch(text: str, edits: Mapping[str, Any], name: str = "config", *, verbatim: bool = True) -> str:
    """``text`` with each dotted path set to its value, unknown paths refused (see the module
    docstring). With ``verbatim`` (and always: JSON has nothing to re-emit) a text none of
    whose values change comes back byte for byte."""
    before = load(text, name)
    if all(equal(get_path(before, dotted), value) for dotted, value in edits.items()):
        return text
    out = text
    for dotted, value in edits.items():
        root = _Scanner(out).value(_WS.match(out, 0).end())  # type: ignore[union-attr]
        out = _apply(out, _replacements(root, out, dotted, value, before, name))
    try:
        again = json.loads(out)
    except json.JSONDecodeError as exc:  # pragma: no cover - would be a bug here
        raise ConfigError(f"{name}: patched JSON does not parse ({exc.msg}); the file was not written") from exc
    check_edits(again, before, edits, name, KIND)
    return out


# ---------------------------------------------------------------- spans


@dataclass
class _Node:
    start: int
    end: int
    value: Any
    children: dict[str, _Node] | list[_Node] | None = None


class _Scanner:
    """Values with their spans; the text is already known to be valid JSON."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()  # type: ignore[union-attr]

    def value(self, i: int) -> _Node:
        ch = self.text[i]
        if ch == "{":
            children: dict[str, _Node] = {}
            j = self._ws(i + 1)
            if self.text[j] == "}":
                return _Node(i, j + 1, {}, children)
            while True:
                key, j = _DECODER.raw_decode(self.text, j)
                j = self._ws(self._ws(j) + 1)  # past ':'
                child = self.value(j)
                children[key] = child
                j = self._ws(child.end)
                if self.text[j] == "}":
                    return _Node(i, j + 1, {k: c.value for k, c in children.items()}, children)
                j = self._ws(j + 1)  # past ','
        if ch == "[":
            items: list[_Node] = []
            j = self._ws(i + 1)
            if self.text[j] == "]":
                return _Node(i, j + 1, [], items)
            while True:
                child = self.value(j)
                items.append(child)
                j = self._ws(child.end)
                if self.text[j] == "]":
                    return _Node(i, j + 1, [c.value for c in items], items)
                j = self._ws(j + 1)
        value, end = _DECODER.raw_decode(self.text, i)
        return _Node(i, end, value)


@dataclass(frozen=True)
class _Style:
    indent: str  # one indentation step ("" for a one-line file)
    ensure_ascii: bool
    separators: tuple[str, str]

    @classmethod
    def of(cls, text: str) -> _Style:
        indent = ""
        lines = text.splitlines()
        for prev, line in itertools.pairwise(lines):
            if prev.rstrip().endswith(("{", "[")) and line.strip():
                lead = line[: len(line) - len(line.lstrip(" \t"))]
                base = prev[: len(prev) - len(prev.lstrip(" \t"))]
                indent = lead[len(base) :] if lead.startswith(base) else lead
                if indent:
                    break
        # \u escapes and no raw non-ASCII: the file is written ASCII-only; keep it so
        ensure_ascii = "\\u" in text and all(ord(c) < 128 for c in text)
        compact = '":' in text and '": ' not in text  # {"a":1,"b":[1,2]}
        return cls(indent, ensure_ascii, (",", ":") if compact else (", ", ": "))


def _replacements(root: _Node, text: str, dotted: str, value: Any, doc: Any, name: str) -> list[_Edit]:
    segs = split_path(dotted)
    node = root
    for depth, seg in enumerate(segs):
        if isinstance(node.children, dict) and str(seg) in node.children:
            node = node.children[str(seg)]
        elif isinstance(node.children, list) and isinstance(seg, int) and 0 <= seg < len(node.children):
            node = node.children[seg]
        elif isinstance(node.children, dict | list):
            walked = ".".join(str(s) for s in segs[: depth + 1])
            last = depth == len(segs) - 1
            raise ConfigError(
                f"{name}: {dotted}: no such key{'' if last else ' ' + walked}{did_you_mean(dotted, all_paths(doc))}"
                + (" (only existing keys are patched)" if last else "")
            )
        else:
            parent = ".".join(str(s) for s in segs[:depth])
            raise ConfigError(
                f"{name}: {dotted}: no such key ({parent} is {_kind(node.value)}, not an object or a list)"
            )
    out: list[_Edit] = []
    _merge(node, value, f"{name}: {dotted}", _Style.of(text), text, out)
    return out


_Edit = tuple[int, int, str]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a string" if isinstance(value, str) else "a number"


def _merge(node: _Node, new: Any, where: str, style: _Style, text: str, out: list[_Edit]) -> None:
    """Replacements that make ``node`` read ``new``; equal values are left as written."""
    if equal(node.value, new):
        return
    if isinstance(node.children, list) and isinstance(new, Sequence) and not isinstance(new, str):
        if len(new) == len(node.children):
            for child, v in zip(node.children, new, strict=True):
                _merge(child, v, where, style, text, out)
            return
        last = node.value[-1] if node.value else None
        like = [number_like(node.value[i] if i < len(node.value) else last, v) for i, v in enumerate(new)]
        out.append((node.start, node.end, _dump(like, node, style, text, where)))
        return
    if isinstance(node.children, dict) and isinstance(new, Mapping):
        for k, v in new.items():
            if str(k) not in node.children:
                raise ConfigError(
                    f"{where}.{k}: no such key{did_you_mean(str(k), node.children)} (only existing keys are patched)"
                )
            _merge(node.children[str(k)], v, f"{where}.{k}", style, text, out)
        return
    out.append((node.start, node.end, _dump(number_like(node.value, new), node, style, text, where)))


def _dump(value: Any, node: _Node, style: _Style, text: str, where: str) -> str:
    """``value`` as JSON text laid out like the text it replaces."""
    if _has_non_finite(value):
        raise ConfigError(f"{where}: {value!r} cannot be written to JSON (NaN and infinity are not JSON numbers)")
    try:
        if not isinstance(value, dict | list) or not style.indent or "\n" not in text[node.start : node.end]:
            return json.dumps(value, ensure_ascii=style.ensure_ascii, separators=style.separators)
        newline = "\r\n" if "\r\n" in text else "\n"  # a CRLF file stays CRLF
        base = _line_indent(text, node.start)
        return json.dumps(value, ensure_ascii=style.ensure_ascii, indent=style.indent).replace("\n", newline + base)
    except TypeError as exc:
        raise ConfigError(f"{where}: {value!r} cannot be written to JSON ({exc})") from exc


def _line_indent(text: str, pos: int) -> str:
    line = text[text.rfind("\n", 0, pos) + 1 : pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


def _apply(text: str, replacements: list[_Edit]) -> str:
    for start, end, new in sorted(replacements, reverse=True):
        text = text[:start] + new + text[end:]
    return text
