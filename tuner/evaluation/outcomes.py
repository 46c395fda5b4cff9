"""What a batch collects per query: a parsed response or a recorded failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from tuner.evaluation.mapping import ParsedResponse


@dataclass(frozen=True, slots=True)
class QueryResponse:
    """A query the service answered with a well-formed response."""

    query_id: str
    request_id: str
    response: ParsedResponse
    latency_ms: float = 0.0
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class FailedQuery:
    """A query that produced no usable response after retries, and why."""

    query_id: str
    request_id: str
    reason: str
    attempts: int = 1
    latency_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "request_id": self.request_id,
            "reason": self.reason,
            "attempts": self.attempts,
            "latency_ms": self.latency_ms,
        }


class UnjudgedHit(msgspec.Struct, frozen=True, gc=False):
    """A returned document without a label: a candidate for the graders. A msgspec
    struct, as Hit: a batch holds thousands, and each trial pickles them to the report
    helper (5x faster than a slots dataclass)."""

    query_id: str
    rank: int
    doc_id: str
    title: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "rank": self.rank, "doc_id": self.doc_id, "title": self.title}
