"""What to do with in-scope queries that have no judgment at all (``--unjudged``).

Such a query scores 0 for every configuration, so it only dilutes every mean: a TREC
topic file of 200 topics with qrels for 54 made equal-weight RRF look like NDCG@10
0.17 instead of 0.63. Default ``drop`` (the console says how many); ``keep`` keeps
them (the console still says how many); ``error`` stops the import naming one.
Out-of-scope queries are never judged and never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .dataset import Judgment, Query
from .errors import DataFormatError

Policy = Literal["drop", "keep", "error"]
POLICIES: tuple[str, ...] = ("drop", "keep", "error")
_EXAMPLES = 10  # ids listed in the manifest; the count is exact


@dataclass(frozen=True)
class UnjudgedOutcome:
    queries: list[Query]
    unjudged: list[str]
    policy: Policy

    def manifest(self) -> dict[str, Any]:
        return {"policy": self.policy, "count": len(self.unjudged), "examples": self.unjudged[:_EXAMPLES]}


def apply_policy(
    queries: list[Query], judgments: Iterable[Judgment], policy: Policy, qrels: Path | str
) -> UnjudgedOutcome:
    judged = {j.query_id for j in judgments}
    unjudged = [q.query_id for q in queries if q.scope == "in" and q.query_id not in judged]
    if unjudged and policy == "error":
        raise DataFormatError.at(
            qrels,
            None,
            f"{len(unjudged)} in-scope queries have no judgment at all, e.g. {unjudged[0]!r}",
            "judge them, or pass --unjudged drop (leave them out) or --unjudged keep",
        )
    if policy == "drop":
        dropped = set(unjudged)
        queries = [q for q in queries if q.query_id not in dropped]
    return UnjudgedOutcome(queries, unjudged, policy)


def describe(manifest_entry: dict[str, Any]) -> str | None:
    """The console line for a manifest's ``unjudged`` entry (None when nothing to say)."""
    count, policy = manifest_entry["count"], manifest_entry["policy"]
    if not count:
        return None
    if policy == "drop":
        return (
            f"dropped {count} in-scope queries without any judgment (they would score 0 for every "
            "configuration); keep them with --unjudged keep"
        )
    return f"kept {count} in-scope queries without any judgment (--unjudged keep): they score 0 for every configuration"
