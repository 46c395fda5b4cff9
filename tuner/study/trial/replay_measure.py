"""The measure stage of a trial whose fusion params are replayed (tuner.config.replay):
one explained retrieval, every candidate setting scored from it, the best verified live.

1. The config is served with the trial's sampled params, every source weighted
   (tuner.study.replay.fusion_search.ReplayPlan.retrieval_values) and the gates at the low end
   of their ranges, and the query set is run once, explained.
2. Every query is replayed at the setting the backend reports it served and compared with
   its live answer (tuner.evaluation.explain_batch.served_mismatch): a backend whose
   fusion is not the replay model fails the trial here, before any replayed number counts.
3. The candidate settings are scored from that one retrieval (replayed responses,
   evaluated like a live batch, the gates solved jointly with the same constraints). A
   grid is bounded first (a cheap upper bound of each setting's solved objective, exact
   feasibility) and only the settings whose bound reaches the ``verify_top`` best are
   scored exactly (tuner.study.replay.fusion_search.ReplayPlan.search): the same best settings
   as scoring them all.
4. The ``verify_top`` best are served and measured live, one after the other. A live
   objective or constraint value further than ``replay.tolerance`` from the replayed one
   fails the trial, saying which setting and by how much. The trial reports the best
   *live* measurement: no replayed number is ever the score of a trial.

`ReplayMeasurer` owns the replay plan, the helper pool and the evaluator's explain path;
it writes, serves and checks the stop flag through the trial's `Measurer`
(tuner.study.trial.measure), like any trial.

The trial's ``replay`` record (a user attribute) holds how the settings were chosen,
how many were scored, and replayed vs live for each verified one; the trial's
``fusion_sweep.csv`` holds every scored setting, best first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import optuna

from tuner.config.objective import Constraint, Objective
from tuner.config.replay import weight_source
from tuner.errors import EvaluationError
from tuner.study.gates.gate_arrays import HitArrays
from tuner.study.replay.fusion_search import ReplayPlan, Scored, ranked, sweep_frame
from tuner.study.replay.replay_pool import ReplayContext, ReplayPool
from tuner.study.trial.interfaces import EvalOutcome, OnResult
from tuner.study.trial.measure import Measurer
from tuner.study.trial.outcome import TrialOutcome

if TYPE_CHECKING:
    import pandas as pd

    from tuner.data.dataset import QuerySet
    from tuner.evaluation.spec import EvalSpec
    from tuner.study.gates.threshold import GateRange


#: replayed settings whose per-query scores a replay trial records for the cross-validated
#: estimate (best first, scored exactly): about 1.5-2 kB each on the demo and Cranfield
CV_SETTINGS = 20


@runtime_checkable
class ExplainingEvaluator(Protocol):
    """What replay needs of the evaluator beyond a batch (tuner.study.trial.live.LiveEvaluator):
    its evaluation spec, query set and labels, and one explained retrieval."""

    spec: EvalSpec
    queries: QuerySet
    qrels: Mapping[str, Mapping[str, int]]

    def explain(
        self, *, request_fields: Mapping[str, Any], reader: Any, order_seed: int, request: Any = None
    ) -> Any: ...

    def evaluate(self, *, order_seed: int, on_result: OnResult | None, request: Any = None) -> Any: ...


@dataclass
class Replayed:
    """A replay trial measured: the best live batch, the config texts it was served
    with, and every setting scored (pandas, best first)."""

    result: EvalOutcome
    texts: dict[Path, str]
    fusion_sweep: pd.DataFrame


@dataclass
class ReplayMeasurer:
    """The replay path of a trial's measure stage (module doc)."""

    plan: ReplayPlan
    measurer: Measurer  # writes, serves and stops as for any trial
    evaluator: ExplainingEvaluator
    objective: Objective
    constraints: Sequence[Constraint]
    pool: ReplayPool | None = None  # helper processes scoring settings; None: in this process

    def replays(self, assignment: Mapping[str, Any]) -> bool:
        """Whether a trial with ``assignment`` (what was suggested or queued) leaves any
        replayed param to solve."""
        return bool(self.plan.to_solve(assignment))

    def retrieval_texts(self, assignment: Mapping[str, Any], solving: Mapping[str, GateRange]) -> dict[Path, str]:
        values = {n: v for n, v in self.plan.retrieval_values().items() if n not in assignment}
        return self.measurer.writer.render({**assignment, **values, **{n: g.low for n, g in solving.items()}})

    def measure(
        self, trial: optuna.Trial, out: TrialOutcome, texts: Mapping[Path, str], solving: Mapping[str, GateRange]
    ) -> Replayed:
        plan, m, ev = self.plan, self.measurer, self.evaluator
        spec = ev.spec
        m.write(out, texts)
        m.check_stop()
        m.serve(out, texts)
        m.check_stop()
        seed = m.order_seed(trial.number)
        document = None
        if plan.config.subscores is not None:  # the setting served is the request's (channel: request)
            from tuner.study.trial.request_channel import RequestWriter, unflatten

            assert isinstance(m.writer, RequestWriter), "replay.subscores needs target.channel: request (prepare)"
            document = unflatten(m.writer.values_of(texts))
        reader = answer_reader(plan, spec, document)
        # channel: request: the trial's values travel in its own requests, explained and verified
        request_of = getattr(m.writer, "request_of", None)
        with m.phases.time(out, "explain"):
            try:
                batch = ev.explain(
                    request_fields=plan.config.request,
                    reader=reader,
                    order_seed=seed,
                    request=request_of(texts) if request_of is not None else None,
                )
            finally:
                m.add_search_time(out)
        problem = served_problem(batch, spec.top_k, plan)
        if problem is not None:
            raise EvaluationError(problem)
        served = batch.served_setting

        context = ReplayContext(
            batch.explained,
            tuple(q.query_id for q in ev.queries),
            tuple(q.scope == "oos" for q in ev.queries),
            {q.query_id: ev.qrels[q.query_id] for q in ev.queries if q.query_id in ev.qrels},
            spec.top_k,
            spec.gains,
            dict(solving),
            self.objective.metric,
            list(self.constraints),
        )
        pool = self.pool

        def score_many(assignments: list[dict[str, Any]]) -> list[Scored]:
            settings = [plan.setting(a, served) for a in assignments]
            scores = pool.score(context, settings) if pool is not None else context.score(settings)
            return [Scored(a, *s) for a, s in zip(assignments, scores, strict=True)]

        def bound_many(assignments: list[dict[str, Any]]) -> list[Any]:
            settings = [plan.setting(a, served) for a in assignments]
            return pool.bound(context, settings) if pool is not None else context.bound(settings)

        maximize = self.objective.maximize
        bounding = bound_many if solving and plan.config.bound else None
        with m.phases.time(out, "replay"):
            scored, how = plan.search(
                lambda a: score_many([a])[0],
                given=out.assignment,
                seed=seed,
                maximize=maximize,
                score_many=score_many,
                bound_many=bounding,
                keep=plan.config.verify_top,
            )
            order = ranked(scored, maximize=maximize)
            out.replay_per_query = self._per_query(context, order, served, solving)
        fusion_sweep = sweep_frame(scored, order)
        verified: list[dict[str, Any]] = []
        best: tuple[Scored, Any, dict[Path, str]] | None = None
        for candidate in order[: plan.config.verify_top]:
            m.check_stop()
            assignment = {**out.assignment, **candidate.assignment}
            candidate_texts = m.writer.render({**assignment, **{n: g.low for n, g in solving.items()}})
            m.write(out, candidate_texts)
            m.serve(out, candidate_texts)
            m.check_stop()
            with m.phases.time(out, "verify"):
                try:
                    result = ev.evaluate(
                        order_seed=seed,
                        on_result=None,
                        request=request_of(candidate_texts) if request_of is not None else None,
                    )
                finally:
                    m.add_search_time(out)
            live = Scored(candidate.assignment, *context.solved(HitArrays.from_batch(result)))
            verified.append(
                {
                    "assignment": candidate.assignment,
                    "replayed": candidate.objective,
                    "live": live.objective,
                    "replayed_violation": candidate.violation,
                    "live_violation": live.violation,
                }
            )
            gap = max(_gap(candidate.objective, live.objective), _gap(candidate.violation, live.violation))
            if gap > plan.config.tolerance:
                raise EvaluationError(
                    f"fusion replay is not exact for this backend: {_short(candidate.assignment)} replayed "
                    f"{candidate.objective:.6f} (violation {candidate.violation:+.4f}) but measured "
                    f"{live.objective:.6f} ({live.violation:+.4f}) live; its fusion differs from the replay model "
                    "(docs/tuning.md, fusion replay): take the params it does not model out of replay.params"
                )
            if best is None or ranked([best[0], live], maximize=maximize)[0] is live:
                best = (live, result, candidate_texts)
        assert best is not None
        live_best, best_result, best_texts = best
        out.assignment.update(live_best.assignment)
        out.replay = {
            "chosen_by": how,
            "settings": len(scored),
            "scored": sum(s.exact for s in scored),
            "verified": verified,
            "served_check": f"{len(batch.responses)} answers replayed exactly at the served setting",
        }
        return Replayed(best_result, best_texts, fusion_sweep)

    def _per_query(
        self, context: ReplayContext, order: Sequence[Scored], served: Any, solving: Mapping[str, GateRange]
    ) -> list[dict[str, Any]]:
        """The per-query scores of the best CV_SETTINGS settings scored exactly (the bounded
        search scores few: those that may reach the verified ones), at their solved gates."""
        exact = [s for s in order if s.exact][:CV_SETTINGS]
        items = [
            (self.plan.setting(s.assignment, served), {n: s.columns[f"solved.{n}"] for n in solving}) for s in exact
        ]
        if not items:
            return []
        values = self.pool.per_query(context, items) if self.pool is not None else context.per_query(items)
        return [
            {
                "setting": _short(s.assignment),
                "violation": s.violation,
                "objective": scores,
                "oos_answered": answered,
                "params": dict(s.assignment),  # the robust pick's neighbourhood (tuner.study.query_scores)
            }
            for s, (scores, answered) in zip(exact, values, strict=True)
        ]


def answer_reader(plan: ReplayPlan, spec: EvalSpec, document: Mapping[str, Any] | None) -> Any:
    """How the explained retrieval's answers are read (tuner.evaluation.explain_batch):
    the reference backend's explain lists, or, with ``replay.subscores``, each hit's
    sub-scores, served at the setting the request's bound values (``document``) and the
    declared fusion give."""
    from tuner.evaluation.explain_batch import ExplainReader, explain_spec
    from tuner.evaluation.subscores import SourcePaths, SubscoreMapping, SubscoreReader

    sub = plan.config.subscores
    if sub is None:
        return ExplainReader(plan.config.explain)
    assert document is not None, "sub-score replay reads the served setting from the request's values"
    body = explain_spec(spec, plan.config.request).request.body
    limit = None if sub.limit is None else _limit(body, sub.limit, spec.top_k)
    mapping = SubscoreMapping({n: SourcePaths(s.score, s.rank) for n, s in sub.sources.items()}, limit)
    return SubscoreReader(mapping, spec.response, plan.served_by_request(document, sub.fusion))


def _limit(body: Mapping[str, Any], path: str, top_k: int) -> int:
    """The value at ``path`` of the explained request's body (``{top_k}`` is top_k)."""
    from tuner.errors import ConfigError

    node: Any = body
    for seg in path.split("."):
        node = node.get(seg) if isinstance(node, Mapping) else None
    if node == "{top_k}":
        node = top_k
    if isinstance(node, bool) or not isinstance(node, int) or node < 1:
        raise ConfigError(
            f"replay.subscores.limit: {path} is {node!r} in the explained request's body; it must name the number "
            "that caps the answer (Azure: top, set in replay.request: {top: 1000})"
        )
    return node


def served_problem(batch: Any, top_k: int, plan: ReplayPlan) -> str | None:
    """Why the explained retrieval cannot be replayed, in one line (None: it can)."""
    from tuner.evaluation.explain_batch import served_mismatch

    if not batch.responses:
        return "fusion replay: no query was answered in the explained retrieval; check the backend (tuner check)"
    sources = set(next(iter(batch.explained.values())).sources)
    for p in plan.params:
        if plan.roles[p.name] == "weights" and set(p.spec.components) != sources:
            return (
                f"fusion replay: {p.name} weighs {sorted(p.spec.components)}, but the backend explains the "
                f"sources {sorted(sources)}; make the simplex's components the backend's sources"
            )
        source = weight_source(plan.roles[p.name])
        if source is not None and source not in sources:
            return (
                f"fusion replay: {p.name} weighs source {source!r}, but the backend explains the sources "
                f"{sorted(sources)}; name one of them in its role (weight:<source>)"
            )
    mismatch = served_mismatch(batch, top_k)
    if mismatch is not None:
        return (
            f"fusion replay does not reproduce the backend's own answers at the setting it served ({mismatch}); "
            "its fusion differs from the replay model (docs/tuning.md, fusion replay): drop replay: or the "
            "params it does not model"
        )
    return None


def _gap(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def _short(assignment: Mapping[str, Any]) -> str:
    parts = []
    for k, v in assignment.items():
        if isinstance(v, Mapping):
            v = "/".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v.values())
        parts.append(f"{k}={v}")
    return ", ".join(parts)
