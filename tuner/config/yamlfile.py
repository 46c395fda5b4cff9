"""Typed YAML files with one-line, located errors.

Search-space and experiment files are read the same way: parsed with ruamel.yaml
(round-trip, so every key keeps its line number), validated by a pydantic model
(``extra="forbid"``), and any problem is raised as one ``ConfigError`` line of the
form ``path/to/file.yaml:LINE: dotted.key: what is wrong (how to fix it)``.

String values may name environment variables, so a file need hold no secret:
``${NAME}`` is the variable's value, ``${NAME:-default}`` falls back to ``default`` when
it is unset or empty, and ``$${`` is a literal ``${``. A variable that is unset and has
no default is a ConfigError naming it and the file:line. Values that land in a secret
place (tuner.secrets) are remembered, so whatever the tuner records later is scrubbed.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from tuner import secrets
from tuner.errors import ConfigError
from tuner.files import display_path

M = TypeVar("M", bound=BaseModel)


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


def format_validation_error(exc: ValidationError, path: Path, doc: Any, model: type[BaseModel] | None = None) -> str:
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
        in_mapping = isinstance(node, Mapping) and seg in node
        in_list = isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node)
        if in_mapping or in_list:
            keys.append(seg)
            node = node[seg]
        elif keep_missing_leaf and i == len(loc) - 1 and isinstance(node, Mapping):
            keys.append(seg)
    return keys


def load_model(
    path: Path,
    model: type[M],
    data: Any = None,
    context: dict[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> M:
    """Validate ``data`` (default: the parsed file) into ``model``, ``${ENV}`` references
    expanded from ``environ`` (default: os.environ); ConfigError with file:line."""
    doc = read_yaml(path) if data is None else data
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{display_path(path)}: expected a mapping at the top level, got {type(doc).__name__}")
    plain = expand_env(to_plain(doc), path=path, doc=doc, environ=environ)
    secrets.remember_config(plain)
    try:
        return model.model_validate(plain, context=context)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path, doc, model)) from exc


_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_ENV_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


def expand_env(data: Any, *, path: Path, doc: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """``data`` (plain, from `to_plain`) with ``${NAME}`` / ``${NAME:-default}`` in its
    string values replaced (see the module docstring); keys are left alone. ``doc`` is
    the round-trip document, for the line of an error."""
    env = os.environ if environ is None else environ

    def walk(node: Any, keys: list[str | int]) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, [*keys, k]) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, [*keys, i]) for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            return _expand(node, env, lambda problem: _env_error(path, doc, keys, problem))
        return node

    return walk(data, [])


def _expand(text: str, env: Mapping[str, str], fail: Callable[[str], NoReturn]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        parsed = _ENV_BODY.fullmatch(body)
        if parsed is None:
            fail(
                f"${{{body}}} is not a variable reference (write ${{NAME}} or ${{NAME:-default}}; "
                "$${ for a literal ${)"
            )
        name, default = parsed.group(1), parsed.group(2)
        value = env.get(name)
        if not value and default is not None:
            return default
        if value is None:
            fail(f"environment variable {name} is not set (export it, or write ${{{name}:-default}})")
        secrets.remember_env(name, value)
        if secrets.is_secret_name(name):
            secrets.remember(value)  # ${API_TOKEN} is a secret wherever it is used
        return value

    return _ENV_REF.sub(one, text)


def _env_error(path: Path, doc: Any, keys: Sequence[str | int], problem: str) -> NoReturn:
    line = line_of(doc, keys) if doc is not None else None
    where = display_path(path) + (f":{line}" if line else "")
    key = ".".join(str(k) for k in keys) or "(top level)"
    raise ConfigError(f"{where}: {key}: {problem}")


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
