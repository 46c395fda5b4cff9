"""The ``shortlist:``: fixed variants enqueued before sampling, inline or in a file of their own.

Public API::

    parse_variants(raw, where) -> list[Variant]     # the shortlist's YAML, checked
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.config.strict import StrictModel
from tuner.config.yamlfile import to_plain
from tuner.errors import ConfigError


class Variant(StrictModel):
    """A fixed assignment enqueued before sampling (partial assignments are allowed)."""

    name: str | None = None
    values: dict[str, Any]


def parse_variants(raw: Any, where: str) -> list[Variant]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: shortlist must be a list of mappings (dotted path -> value, optional name:)")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item:
            raise ConfigError(f"{where}: shortlist[{i}]: expected a non-empty mapping of dotted path -> value")
        item = dict(to_plain(item))
        name = item.pop("name", None)
        if not item:
            raise ConfigError(f"{where}: shortlist[{i}]: the variant sets no values")
        out.append(Variant(name=None if name is None else str(name), values=item))
    return out
