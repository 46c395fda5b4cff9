"""TOML config files: patched through tomlkit, which keeps a document's layout.

Comments (own-line and trailing), key order, tables and arrays of tables, spacing,
indentation and inline arrays survive; only the patched values change. A value keeps its
type (an int stays an int, a float a float) and a literal string (``'...'``) stays
literal. The patched text is read back by the standard library's parser (tomllib), an
independent check that it is valid TOML holding exactly the edited values.

    load(text, name) -> dict             # plain (tomlkit's wrappers removed)
    patch(text, edits, name, verbatim=True) -> str
"""

from __future__ import annotations

import copy
import functools
import math
import tomllib
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Array, String, StringType
from tomlkit.toml_document import TOMLDocument

from tuner.config.formats.paths import MISSING, all_paths, check_edits, equal, get_path, number_like, split_path
from tuner.config.yamlfile import did_you_mean
from tuner.errors import ConfigError

KIND = "TOML"


def load(text: str, name: str) -> dict[str, Any]:
    return _parsed(text, name).unwrap()


def patch(text: str, edits: Mapping[str, Any], name: str = "config", *, verbatim: bool = True) -> str:
    """``text`` with each dotted path set to its value, unknown paths refused (see the module
    docstring). With ``verbatim`` a text none of whose values change comes back byte for byte."""
    pristine = _parsed(text, name)
    before = pristine.unwrap()
    if verbatim and all(equal(get_path(before, dotted), value) for dotted, value in edits.items()):
        return text
    doc = copy.deepcopy(pristine)
    for dotted, value in edits.items():
        _set(doc, dotted, value, name, before)
    out = tomlkit.dumps(doc)
    try:
        again = tomllib.loads(out)
    except tomllib.TOMLDecodeError as exc:  # pragma: no cover - would be a tomlkit bug
        raise ConfigError(f"{name}: patched TOML does not parse ({exc}); the file was not written") from exc
    check_edits(again, before, edits, name, KIND)
    return out


@functools.lru_cache(maxsize=16)
def _parsed(text: str, name: str) -> TOMLDocument:
    """The tomlkit document of ``text``; callers deep-copy it before patching."""
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"{name}: invalid TOML: {str(exc).splitlines()[0]}") from exc


def _set(doc: TOMLDocument, dotted: str, value: Any, name: str, plain: Any) -> None:
    segs = split_path(dotted)
    node: Any = doc
    for depth, seg in enumerate(segs[:-1]):
        child = get_path(node, str(seg))
        if child is MISSING or not isinstance(child, Mapping | list):
            walked = ".".join(str(s) for s in segs[: depth + 1])
            if child is MISSING:
                raise ConfigError(f"{name}: {dotted}: no such key {walked}{did_you_mean(dotted, all_paths(plain))}")
            raise ConfigError(f"{name}: {dotted}: no such key ({walked} is a value, not a table or an array)")
        node = child
    leaf = segs[-1]
    if isinstance(node, Mapping):
        key: Any = str(leaf)
        if key not in node:
            hint = did_you_mean(dotted, all_paths(plain))
            raise ConfigError(f"{name}: {dotted}: no such key{hint} (only existing keys are patched)")
    elif isinstance(node, list) and isinstance(leaf, int) and 0 <= leaf < len(node):
        key = leaf
    else:
        raise ConfigError(f"{name}: {dotted}: no such key{did_you_mean(dotted, all_paths(plain))}")
    merged = _merge(node[key], value, f"{name}: {dotted}")
    if merged is not node[key]:
        node[key] = merged


def _merge(old: Any, new: Any, where: str) -> Any:
    """``new`` shaped like ``old``: tables and arrays updated in place (their layout and
    comments kept), number types and literal strings kept, equal values left as written."""
    if equal(old, new):
        return old
    if isinstance(old, Array | AoT) and isinstance(new, Sequence) and not isinstance(new, str):
        if len(new) == len(old):
            for i, v in enumerate(new):
                merged = _merge(old[i], v, where)
                if merged is not old[i]:
                    old[i] = merged
            return old
        if isinstance(old, AoT):
            raise ConfigError(f"{where}: an array of tables keeps its length here ({len(old)} tables); set its keys")
        last = old[-1] if len(old) else None
        items = [_scalar_like(old[i] if i < len(old) else last, v, where) for i, v in enumerate(new)]
        old.clear()
        old.extend(items)
        return old
    if isinstance(old, MutableMapping) and isinstance(new, Mapping):
        for k, v in new.items():
            if str(k) not in old:
                raise ConfigError(
                    f"{where}.{k}: no such key{did_you_mean(str(k), old)} (only existing keys are patched)"
                )
            merged = _merge(old[str(k)], v, f"{where}.{k}")
            if merged is not old[str(k)]:
                old[str(k)] = merged
        return old
    return _scalar_like(old, new, where)


def _scalar_like(old: Any, new: Any, where: str) -> Any:
    if new is None:
        raise ConfigError(f"{where}: TOML has no null; give a value")
    if isinstance(new, float) and not math.isfinite(new) and not isinstance(old, float):
        raise ConfigError(f"{where}: {new!r} for an integer key (give a finite number)")
    if isinstance(old, String) and isinstance(new, str) and old.type is StringType.SLL and not _needs_escape(new):
        return tomlkit.string(new, literal=True)  # keep the user's quoting style
    return number_like(old, new)


def _needs_escape(text: str) -> bool:
    return "'" in text or any(ord(c) < 32 or ord(c) == 127 for c in text)
