"""Seeded, stratified split of a query set into a *tune* part and a *holdout* part.

The sampler only ever sees tune-split scores; the holdout is touched once, at the end,
to check that the best trial's win over the baseline is not an artefact of choosing
the best of many noisy trials on the same queries (selection bias).

Why the split is built the way it is:

- Stratified by (query_type, scope) so the holdout has the same mix of query kinds and
  the same share of out-of-scope queries as the tune part; a holdout without OOS
  queries could not check the OOS constraint.
- Per-stratum holdout counts use largest-remainder rounding: the total is exactly
  ``round(N * fraction)`` and every stratum is within one query of ``n * fraction``.
- Inside a stratum, queries are ranked by a keyed hash of (seed, query_id), not by a
  shuffle of the file order: the split does not change when the file is reordered or
  reformatted, and adding a query moves at most a query or two of the old ones.
- A query set whose every query carries ``split: tune`` / ``split: holdout`` is taken
  as given (the user fixed the split by hand).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.dataset import Query
from tuner.errors import ConfigError

TUNE = "tune"
HOLDOUT = "holdout"
StratumKey = Literal["query_type", "scope", "source"]


class HoldoutConfig(BaseModel):
    """The ``holdout:`` section of an experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    fraction: float = Field(0.3, gt=0.0, lt=1.0, description="share of each stratum kept for the holdout")
    seed: int = Field(0, description="changes which queries land in the holdout; keep it fixed across a study")
    stratify_by: tuple[StratumKey, ...] = ("query_type", "scope")
    use_split_field: bool = Field(
        True, description="when every query carries split: tune|holdout, use it instead of drawing a split"
    )


@dataclass(frozen=True)
class Split:
    """Which query ids are tuned on and which are held out (both in query-set order)."""

    tune: tuple[str, ...]
    holdout: tuple[str, ...]
    seed: int
    fraction: float
    source: Literal["drawn", "split_field"] = "drawn"

    def __post_init__(self) -> None:
        if overlap := set(self.tune) & set(self.holdout):
            raise ValueError(f"tune and holdout overlap on {sorted(overlap)[:5]}")

    def part(self, name: str) -> tuple[str, ...]:
        if name == TUNE:
            return self.tune
        if name == HOLDOUT:
            return self.holdout
        raise KeyError(f"unknown split part {name!r}; use {TUNE!r} or {HOLDOUT!r}")

    def to_dict(self) -> dict[str, object]:
        return {
            "seed": self.seed, "fraction": self.fraction, "source": self.source,
            "tune": list(self.tune), "holdout": list(self.holdout),
        }


def stratum_of(query: Query, keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(getattr(query, key)) for key in keys)


def split_queries(queries: Iterable[Query], config: HoldoutConfig | None = None) -> Split:
    """Split ``queries`` per ``config`` (defaults: 30% holdout, seed 0, by query_type and scope)."""
    config = config or HoldoutConfig()
    queries = list(queries)
    if not queries:
        raise ConfigError("holdout: the query set is empty; nothing to split")
    if config.use_split_field and (given := _split_from_field(queries)) is not None:
        return given
    return draw_split(queries, fraction=config.fraction, seed=config.seed, stratify_by=config.stratify_by)


def draw_split(
    queries: Sequence[Query], *, fraction: float, seed: int, stratify_by: Sequence[str] = ("query_type", "scope")
) -> Split:
    """The seeded stratified split (see the module docstring for the rules)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"holdout.fraction must be in (0, 1), got {fraction}; e.g. 0.3 keeps 30% for the holdout")
    strata: dict[tuple[str, ...], list[Query]] = {}
    for query in queries:
        strata.setdefault(stratum_of(query, stratify_by), []).append(query)
    quotas = allocate(
        {key: len(members) for key, members in strata.items()}, fraction, tiebreak=lambda key: _rank_key(seed, "|".join(key))
    )
    held: set[str] = set()
    for key, members in strata.items():
        ranked = sorted(members, key=lambda q: _rank_key(seed, q.query_id))
        held.update(q.query_id for q in ranked[: quotas[key]])
    tune = tuple(q.query_id for q in queries if q.query_id not in held)
    holdout = tuple(q.query_id for q in queries if q.query_id in held)
    if not tune:
        raise ConfigError(f"holdout.fraction={fraction} leaves no query to tune on; lower it")
    return Split(tune=tune, holdout=holdout, seed=seed, fraction=fraction)


def allocate(sizes: dict[tuple[str, ...], int], fraction: float, tiebreak=None) -> dict[tuple[str, ...], int]:
    """Largest-remainder rounding of ``n * fraction`` per stratum.

    The quotas sum to ``round(total * fraction)`` (ties of the total rounded half up)
    and each quota is ``floor`` or ``ceil`` of its stratum's exact share.
    """
    exact = {key: n * fraction for key, n in sizes.items()}
    quotas = {key: math.floor(share) for key, share in exact.items()}
    target = math.floor(sum(sizes.values()) * fraction + 0.5)
    order = sorted(
        exact,
        key=lambda key: (-(exact[key] - quotas[key]), tiebreak(key) if tiebreak else key),
    )
    for key in order[: max(0, target - sum(quotas.values()))]:
        quotas[key] += 1
    return quotas


def _rank_key(seed: int, name: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=16).digest()


def _split_from_field(queries: Sequence[Query]) -> Split | None:
    values = {q.split for q in queries}
    if values != {TUNE, HOLDOUT}:  # partial or other split names: draw a split instead
        return None
    tune = tuple(q.query_id for q in queries if q.split == TUNE)
    holdout = tuple(q.query_id for q in queries if q.split == HOLDOUT)
    return Split(tune=tune, holdout=holdout, seed=-1, fraction=len(holdout) / len(queries), source="split_field")
