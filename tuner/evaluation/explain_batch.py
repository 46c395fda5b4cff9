"""The explained retrieval of fusion replay: the query set run once with the backend asked
to explain each search (fields merged into the request body), keeping per query the
live answer and the explanation decoded for replay (tuner.evaluation.fusion_replay).
A reader turns each answer into that explanation and the setting it was served at:
``ExplainReader`` the reference backend's explain lists (the setting in them),
tuner.evaluation.subscores.SubscoreReader an engine's per-hit sub-scores (the setting
from the request sent).

``served_mismatch`` replays every query at the setting the backend reports it served
and compares with its live answer: a backend whose fusion differs from the replay model
is caught on the very retrieval the study would trust.

A replayed answer never lists a document twice (the candidates of a tier are a union,
as in the reference backend's fusion), and a live one holds each document once after
parsing (tuner.evaluation.mapping: later copies are removed before ranking), so the
two compare rank for rank once the live answer had no repeat to remove; a backend that
repeats a hit is not the replay model, and ``served_mismatch`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tuner.data.dataset import QuerySet
from tuner.errors import ResponseMappingError
from tuner.evaluation.batch import Abort, BatchTiming, run_batch
from tuner.evaluation.fusion_replay import Explained, FusionSetting, replay
from tuner.evaluation.mapping import ParsedResponse, resolve_path
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.spec import EvalSpec


@dataclass
class ExplainedBatch:
    """One explained retrieval: per answered query its live response and explanation;
    the queries that failed (they fail in every replayed setting too)."""

    responses: dict[str, QueryResponse] = field(default_factory=dict)
    explained: dict[str, Explained] = field(default_factory=dict)
    served: dict[str, FusionSetting] = field(default_factory=dict)
    failed: list[FailedQuery] = field(default_factory=list)

    @property
    def served_setting(self) -> FusionSetting | None:
        """The setting the backend served (the same for every query of a batch)."""
        return next(iter(self.served.values()), None)


class AnswerReader(Protocol):
    """Reads one answer of the explained retrieval for replay."""

    #: what an answer lacking it lacks, for the error message
    what: str

    def read(self, payload: Any, query_id: str) -> tuple[Explained, FusionSetting] | None:
        """The answer's explanation and served setting; None when the answer has none."""
        ...


@dataclass(frozen=True)
class ExplainReader:
    """The reference backend's explanation at ``path`` of an answer (its per-tier,
    per-source candidate lists and the setting it served)."""

    path: str = "explain"

    @property
    def what(self) -> str:
        return f"explanation at {self.path!r}"

    def read(self, payload: Any, query_id: str) -> tuple[Explained, FusionSetting] | None:
        raw = resolve_path(payload, self.path)
        if not isinstance(raw, Mapping):
            return None
        return Explained.parse(raw, query_id), FusionSetting.served(raw)


def explain_spec(spec: EvalSpec, request_fields: Mapping[str, Any]) -> EvalSpec:
    """``spec`` with ``request_fields`` merged into its request body."""
    body = {**spec.request.body, **request_fields}
    return spec.model_copy(update={"request": spec.request.model_copy(update={"body": body})})


def run_explained(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    request_fields: Mapping[str, Any],
    reader: AnswerReader,
    order_seed: int | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
) -> ExplainedBatch:
    """Run ``queries`` once, explained. A query whose answer lacks the explanation fails
    the batch with ResponseMappingError (replaying it would silently score it 0)."""
    out = ExplainedBatch()
    missing: list[str] = []

    def keep(query_id: str, payload: Any, outcome: QueryResponse) -> None:
        read = reader.read(payload, query_id)
        if read is None:
            missing.append(query_id)
            return
        out.explained[query_id], out.served[query_id] = read
        out.responses[query_id] = outcome

    builder = run_batch(
        explain_spec(spec, request_fields),
        queries,
        qrels,
        order_seed=order_seed,
        abort=abort,
        timing=timing,
        defer=True,
        on_payload=keep,
    )
    if missing:
        raise ResponseMappingError(
            f"{len(missing)} answer(s) have no {reader.what} (query {sorted(missing)[0]}); "
            "the backend must answer the replay.request fields with its per-source candidate lists "
            '(reference backend: "explain": true) or sub-scores (Azure: debug: vector); fix replay.explain / '
            "replay.subscores / replay.request, or drop replay:"
        )
    out.failed = builder.failed_outcomes()
    return out


def served_mismatch(batch: ExplainedBatch, top_k: int) -> str | None:
    """The first query whose live answer differs from its replay at the served setting,
    described in one line; None when all agree (scores to 1e-12 relative)."""
    for qid in sorted(batch.responses):
        live = batch.responses[qid].response
        replayed = replay(batch.explained[qid], batch.served[qid], top_k)
        problem = _difference(live, replayed)
        if problem is not None:
            return f"query {qid}: {problem}"
    return None


def _difference(live: ParsedResponse, replayed: ParsedResponse) -> str | None:
    if live.repeats:  # removed when parsed, so the rest might still agree: the model does not
        return f"the live answer listed {live.repeats} doc ids again (removed before ranking); the replay never does"
    live_ids, rep_ids = [h.doc_id for h in live.hits], [h.doc_id for h in replayed.hits]
    if live_ids != rep_ids:
        at = next(
            (i for i, (a, b) in enumerate(zip(live_ids, rep_ids, strict=False)) if a != b),
            min(len(live_ids), len(rep_ids)),
        )
        return (
            f"ranking differs at rank {at + 1} (live {live_ids[at : at + 1] or 'end'}, replayed "
            f"{rep_ids[at : at + 1] or 'end'})"
        )
    for rank, (a, b) in enumerate(zip(live.hits, replayed.hits, strict=True), 1):
        if a.score is None or not math.isclose(a.score, b.score or 0.0, rel_tol=1e-12, abs_tol=1e-15):
            return f"score at rank {rank} differs (live {a.score}, replayed {b.score})"
    if live.confidence is not None and not math.isclose(
        live.confidence, replayed.confidence or 0.0, rel_tol=1e-12, abs_tol=1e-15
    ):
        return f"confidence differs (live {live.confidence}, replayed {replayed.confidence})"
    if live.handoff is not None and bool(live.handoff) != bool(replayed.handoff):
        return f"handoff differs (live {live.handoff}, replayed {replayed.handoff})"
    return None
