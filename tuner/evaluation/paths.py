"""Response paths: the dotted paths a response mapping reads an answer by.

A path is keys joined by dots (``data.hits``); a numeric segment indexes a list
(``data.0.hits``). A key that itself holds a dot is written with a backslash before
it: ``@search\\.score`` is the one key ``@search.score`` (Azure AI Search), and ``\\\\``
is a backslash in a key. In YAML write it single-quoted (``score: '@search\\.score'``)
or double-quoted with the backslash doubled (``score: "@search\\\\.score"``).

Every path without a backslash means what it always meant; a backslash before
anything but a dot or a backslash, a trailing one, and an empty key (``a..b``) are
refused, so a typo never reads a key nobody meant.
"""

from __future__ import annotations

from functools import lru_cache

from tuner.errors import ConfigError


@lru_cache(maxsize=256)
def split_path(path: str) -> tuple[str, ...]:
    """The keys of a response path, escapes resolved; ConfigError when malformed."""
    if "\\" not in path:
        keys = tuple(path.split("."))
    else:
        out: list[str] = []
        key: list[str] = []
        chars = iter(path)
        for ch in chars:
            if ch == "\\":
                nxt = next(chars, "")
                if nxt not in (".", "\\"):
                    raise ConfigError(_malformed(path, "a backslash must be followed by '.' or '\\'"))
                key.append(nxt)
            elif ch == ".":
                out.append("".join(key))
                key = []
            else:
                key.append(ch)
        out.append("".join(key))
        keys = tuple(out)
    if "" in keys:
        raise ConfigError(_malformed(path, "it has an empty key"))
    return keys


def is_plain_key(path: str) -> bool:
    """Whether ``path`` is a single key that needs no unescaping (the common case)."""
    return "." not in path and "\\" not in path


def single_key(path: str) -> str | None:
    """The one key ``path`` names, or None when it has more than one."""
    keys = split_path(path)
    return keys[0] if len(keys) == 1 else None


def _malformed(path: str, why: str) -> str:
    return (
        f"response path {path!r} is malformed ({why}); join keys with '.', write a dot inside a key "
        "as '\\.' (YAML: '@search\\.score' single-quoted) and a backslash as '\\\\'"
    )
