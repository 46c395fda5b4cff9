"""An assignment's values under flat config keys: the one rule every place that shows
or records a trial's values by name uses (the Optuna params of the applied values,
MLflow params, `tuner best` / `tuner report` tables, the fusion sweep table).

The rule: a mapping's values go under ``key.sub`` (``fusion.weights`` {bm25, dense} ->
``fusion.weights.bm25``, ``fusion.weights.dense``) and a list's under its positions
(``fallback.windows_days`` [30, 90] -> ``fallback.windows_days.0``,
``fallback.windows_days.1``), recursively, so every leaf is one number or word that a
dashboard can plot; an empty mapping or list stays one value under its own key (nothing
the config holds disappears). These are the names the reference backend's own errors
and the restart-key patterns use for list items (``fallback.windows_days.0``).

Public API::

    leaves(values) -> iterator of (path of keys, leaf value)
    flatten(values) -> {"a.b.0": leaf, ...}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def leaves(values: Mapping[Any, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each leaf of ``values`` with the keys leading to it (a list's positions as text),
    in the mapping's order; a top-level key that holds dots stays one key."""
    for key, value in values.items():
        yield from _walk((str(key),), value)


def flatten(values: Mapping[Any, Any]) -> dict[str, Any]:
    """``values`` under flat keys: the path of `leaves` joined by dots."""
    return {".".join(path): value for path, value in leaves(values)}


def _walk(path: tuple[str, ...], value: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, Mapping) and value:
        for sub, item in value.items():
            yield from _walk((*path, str(sub)), item)
    elif isinstance(value, (list, tuple)) and value:
        for index, item in enumerate(value):
            yield from _walk((*path, str(index)), item)
    else:
        yield path, value
