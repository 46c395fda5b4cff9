"""Typed YAML files with one-line, located errors.

Search-space and experiment files are read the same way: parsed with ruamel.yaml
(round-trip, so every key keeps its line number), validated by a pydantic model
(``extra="forbid"``), and any problem is raised as one ``ConfigError`` line of the
form ``path/to/file.yaml:LINE: dotted.key: what is wrong (how to fix it)``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from tuner.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter messages)."""
    p = Path(path)
    try:
        return os.path.relpath(p) if p.is_absolute() and Path.cwd() in p.parents else str(p)
    except ValueError:  # different drive (Windows)
        return str(p)


def read_yaml(path: Path) -> Any:
    """Parse ``path`` (round-trip, so errors can name lines). ConfigError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{display_path(path)}: file not found (check the path)") from exc
    except OSError as exc:
        raise ConfigError(f"{display_path(path)}: cannot read: {exc.strerror}") from exc
    try:
        return YAML(typ="rt").load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{display_path(path)}{line}: invalid YAML: {problem}") from exc


def line_of(doc: Any, loc: Sequence[str | int]) -> int | None:
    """1-based line of the deepest key of ``loc`` found in a round-trip document.

    Segments not present in the document (pydantic union tags, model names) are skipped.
    """
    line: int | None = None
    node = doc
    for seg in loc:
        lc = getattr(node, "lc", None)
        if isinstance(node, Mapping) and seg in node:
            if lc is not None:
                try:
                    line = lc.key(seg)[0] + 1
                except (KeyError, TypeError):
                    pass
            node = node[seg]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            if lc is not None:
                try:
                    line = lc.item(seg)[0] + 1
                except (KeyError, TypeError):
                    pass
            node = node[seg]
    return line


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` when a close candidate exists, else an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the (sub)model that holds the unknown key at ``loc``."""
    current: Any = model
    for seg in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or not isinstance(seg, str) or seg not in fields:
            continue
        ann = fields[seg].annotation
        current = _first_model(ann)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


def _first_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def format_validation_error(
    exc: ValidationError, path: Path, doc: Any, model: type[BaseModel] | None = None
) -> str:
    """The first pydantic error as ``file:line: key: message``."""
    err = exc.errors()[0]
    loc = [s for s in err["loc"] if not (isinstance(s, str) and s.startswith("function-"))]
    line = line_of(doc, loc)
    where = display_path(path) + (f":{line}" if line else "")
    keys = _doc_keys(doc, loc, keep_missing_leaf=err["type"] == "missing")
    key = ".".join(str(s) for s in keys) or "(top level)"
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc) if model is not None else []
        hint = did_you_mean(str(loc[-1]), allowed)
        if not hint and allowed:
            hint = f" (allowed: {', '.join(allowed)})"
        return f"{where}: {key}: unknown key{hint}"
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] == "missing":
        return f"{where}: {key}: required key is missing (add it)"
    return f"{where}: {key}: {msg}"


def _doc_keys(doc: Any, loc: Sequence[str | int], keep_missing_leaf: bool) -> list[str | int]:
    """The segments of ``loc`` that are real keys of the document (drops union tags);
    a missing leaf key is kept so the message names it."""
    keys: list[str | int] = []
    node = doc
    for i, seg in enumerate(loc):
        if isinstance(node, Mapping) and seg in node:
            keys.append(seg)
            node = node[seg]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            keys.append(seg)
            node = node[seg]
        elif keep_missing_leaf and i == len(loc) - 1 and isinstance(node, Mapping):
            keys.append(seg)
    return keys


def load_model(path: Path, model: type[M], data: Any = None, context: dict[str, Any] | None = None) -> M:
    """Validate ``data`` (default: the parsed file) into ``model``; ConfigError with file:line."""
    doc = read_yaml(path) if data is None else data
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{display_path(path)}: expected a mapping at the top level, got {type(doc).__name__}")
    try:
        return model.model_validate(to_plain(doc), context=context)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path, doc, model)) from exc


def to_plain(node: Any) -> Any:
    """Round-trip containers and scalars -> plain dict / list / int / float / str / bool."""
    if isinstance(node, Mapping):
        return {to_plain(k): to_plain(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [to_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node
