"""Preflight: does this set-up measure what the user thinks, before the first trial?

An overnight tool's worst failure is a plausible number from a broken set-up: a
request that never sends what the backend looks results up by, doc ids in another
format than the labels', a baseline that hands off most queries, a constraint with
nothing to constrain. Each of those scores "0.0000 ... feasible" with exit code 0.
These checks look at the experiment's pieces and at one batch of the config as found,
and say what is wrong, the evidence and the fix, in one line.

Pure: the caller runs the batch (tuner.ops.check does it for experiments,
`tuner eval` for its own batch) and prints. Levels:

- ``stop``: the numbers would be wrong; `tuner check` / `run` / `worker` / `eval` /
  `apply` exit 2 with the first stop (``--skip-checks`` overrides, and the reports say so);
- ``warn``: the numbers are right but may not mean what the user thinks;
- ``info``: facts worth printing (the baseline's handoff share, a sample size).

The same rule that stops a preflight on empty results guards every trial
(``empty_results_problem``): a trial whose batch is mostly empty fails with that
reason, under the failure budget, instead of scoring 0.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tuner.errors import ConfigError, TunerError

if TYPE_CHECKING:
    from tuner.data.dataset import QuerySet
    from tuner.evaluation.result import BatchResult
    from tuner.evaluation.spec import EvalSpec

Level = Literal["stop", "warn", "info"]

#: "most" queries: above this share of the in-scope queries a batch is broken, not bad
MOST = 0.5
#: the baseline's handoff share above which the preflight warns (it always says it)
HANDOFF_WARN = 0.10
#: Judged@10 below this: most shown hits are unlabelled and count as Irrelevant
LOW_COVERAGE = 0.5
#: an OOS constraint over fewer OOS queries is decided by one or two queries
MIN_OOS_QUERIES = 5
#: query sets larger than this are checked on a seeded sample of SAMPLE_SIZE queries
MAX_FULL_CHECK = 500
SAMPLE_SIZE = 300
#: metrics whose denominator is the OOS queries (a constraint on them needs some)
OOS_DENOMINATOR_METRICS = frozenset({"OOS_FP_Rate", "Handoff_Recall", "Handoff_F1"})

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CONFIG_KEY = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+")  # a dotted config key in a reason


class PreflightError(TunerError):
    """The preflight found a set-up that would give wrong numbers (exit code 2)."""


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``code`` names the check, ``message`` is one line."""

    code: str
    level: Level
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "level": self.level, "message": self.message}

    @property
    def note(self) -> str:
        """The line `tuner run` and `tuner eval` print for it."""
        return f"preflight {self.level}: {self.message}"


@dataclass
class PreflightReport:
    """Everything the checks found, and on what."""

    findings: list[Finding] = field(default_factory=list)
    n_checked: int = 0  # queries in the checked batch
    n_total: int = 0  # queries in the query set
    sample_seed: int | None = None  # set when a sample was checked
    skipped: bool = False  # --skip-checks: findings kept, nothing stops

    @property
    def stops(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "stop"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warn"]

    @property
    def sampled(self) -> bool:
        return self.sample_seed is not None

    @property
    def verdict(self) -> str:
        """One word for tags and tables: passed | warnings | skipped (n stops ignored) | stopped."""
        if self.skipped:
            return "skipped" + (f" ({len(self.stops)} stops ignored)" if self.stops else "")
        if self.stops:
            return "stopped"
        return "warnings" if self.warnings else "passed"

    def extend(self, findings: Iterable[Finding]) -> PreflightReport:
        self.findings.extend(findings)
        return self

    def raise_for_stops(self, where: str = "preflight") -> None:
        """PreflightError with the first stop (and how many more), unless skipped."""
        stops = self.stops
        if not stops or self.skipped:
            return
        more = f" (+{len(stops) - 1} more: `tuner check` lists them)" if len(stops) > 1 else ""
        raise PreflightError(f"{where}: {stops[0].message}{more}; --skip-checks runs anyway (the reports record it)")

    def for_reports(self) -> dict[str, Any]:
        """What every report's ``context.preflight`` holds: the verdict and the findings."""
        return {"verdict": self.verdict, "findings": [f.to_dict() for f in self.findings]}

    def to_dict(self) -> dict[str, Any]:
        """What the study attribute records (the report's view plus what was checked)."""
        return {
            "skipped": self.skipped,
            "passed": not self.stops,
            "n_checked": self.n_checked,
            "n_total": self.n_total,
            "sample_seed": self.sample_seed,
            "findings": [f.to_dict() for f in self.findings],
        }


# ------------------------------------------------------------------ before any traffic


def static_checks(
    spec: EvalSpec,
    queries: QuerySet,
    constraints: Sequence[Any],
    *,
    unjudged_note: str | None = None,
    unjudged_policy: str = "drop",
) -> list[Finding]:
    """Every check that needs no traffic: what the unjudged-queries policy did, the
    request template against the queries, the constraints against the OOS queries."""
    return [
        *check_judged_queries(unjudged_note, unjudged_policy),
        *check_request_fields(spec, queries),
        *check_constraints(constraints, queries),
    ]


def check_request_fields(spec: EvalSpec, queries: QuerySet) -> list[Finding]:
    """The request template against the query set: a name the queries lack (every
    request would fail), extra fields nobody sends (date hints, filters silently
    ignored), and whether ``query_id`` goes out (run sources look results up by it)."""
    from tuner.evaluation.mapping import build_body

    out: list[Finding] = []
    for query in queries:
        try:
            build_body(spec.request, query, spec.top_k)
        except ConfigError as exc:
            out.append(Finding("template_field", "stop", str(exc)))
            break
    referenced = set(_placeholders(spec.request.body))
    if not spec.request.pass_extra:
        extra = Counter(name for q in queries for name in q.extra if name not in referenced)
        if extra:
            names = ", ".join(f"{n} ({c} queries)" for n, c in extra.most_common(3))
            out.append(
                Finding(
                    "unsent_fields",
                    "stop",
                    f"the query set carries fields the request never sends: {names}; reference them in "
                    f'evaluation.request.body (e.g. {extra.most_common(1)[0][0]}: "{{{extra.most_common(1)[0][0]}}}"), '
                    "set pass_extra: true, or remove them from the queries",
                )
            )
    return out


def sends_query_id(spec: EvalSpec) -> bool:
    return "query_id" in _placeholders(spec.request.body)


def check_constraints(constraints: Sequence[Any], queries: QuerySet) -> list[Finding]:
    """An OOS constraint needs OOS queries, and enough of them for its bound to mean
    something: with n OOS queries the rate moves in steps of 1/n."""
    n_oos = len(queries.oos())
    out: list[Finding] = []
    for c in constraints:
        if c.metric not in OOS_DENOMINATOR_METRICS:
            continue
        if n_oos == 0:
            out.append(
                Finding(
                    "no_oos",
                    "stop",
                    f"constraint {c.name!r} is declared but the query set has no out-of-scope queries, so every trial "
                    "would count as feasible; add queries with scope: oos, or remove the constraint",
                )
            )
        elif n_oos < MIN_OOS_QUERIES:
            out.append(
                Finding(
                    "few_oos",
                    "stop",
                    f"constraint {c.name!r} rests on {n_oos} out-of-scope queries: {c.metric} moves in steps of "
                    f"{1 / n_oos:.2f}, so one query decides feasibility; add OOS queries (at least {MIN_OOS_QUERIES}, "
                    f"{math.ceil(1 / c.bound) if c.bound > 0 else MIN_OOS_QUERIES}+ for this bound) or remove the "
                    "constraint",
                )
            )
        elif c.op == "<=" and 0 < c.bound < 1 / n_oos:
            out.append(
                Finding(
                    "coarse_oos",
                    "warn",
                    f"constraint {c.name!r}: with {n_oos} out-of-scope queries {c.metric} moves in steps of "
                    f"{1 / n_oos:.3f}, so the bound acts as {c.metric} = 0 (no OOS query answered)",
                )
            )
    return out


def gate_constraint(gate: Any) -> Any:
    """A `tuner eval` gate (--fail-over OOS_FP_Rate=0.1) as the constraint it stands for."""
    from tuner.config.objective import Constraint

    return Constraint(metric=gate.metric, op="<=" if gate.kind == "over" else ">=", bound=gate.threshold)


def check_judged_queries(note: str | None, policy: str) -> list[Finding]:
    """What the unjudged-queries policy did (tuner.data.dataset.judged_subset), as a finding."""
    if not note:
        return []
    return [Finding("unjudged_queries", "warn" if policy == "keep" else "info", note)]


# ------------------------------------------------------------------ on one batch


def sample_queries(
    queries: QuerySet, *, max_full: int = MAX_FULL_CHECK, size: int = SAMPLE_SIZE, seed: int = 0
) -> tuple[QuerySet, int | None]:
    """The queries to check: all of a small set; of a big one a seeded sample that keeps
    the in-scope / OOS proportions (at least a few OOS queries when there are any).
    Returns the set and the seed (None when not sampled)."""
    if len(queries) <= max_full:
        return queries, None
    rng = random.Random(seed)
    oos, ins = [q.query_id for q in queries.oos()], [q.query_id for q in queries.in_scope()]
    n_oos = min(len(oos), max(round(size * len(oos) / len(queries)), min(len(oos), 2 * MIN_OOS_QUERIES)))
    picked = set(rng.sample(oos, n_oos)) | set(rng.sample(ins, min(len(ins), size - n_oos)))
    return queries.subset(query_ids=[q.query_id for q in queries if q.query_id in picked]), seed


def check_batch(
    result: BatchResult,
    spec: EvalSpec,
    *,
    gate_values: Mapping[str, Any] | None = None,
    gates_solved: bool = False,
    raw_response: Callable[[str], str] | None = None,
) -> list[Finding]:
    """Every check on one batch of the config as found.

    ``gate_values``: config key -> current value of the post-retrieval gates (named when
    the baseline hands off a lot); ``gates_solved``: the study solves them per trial, so
    a baseline that hands off most queries is a warning, not a stop;
    ``raw_response(query_id)``: one raw response body, fetched only when most queries
    came back empty (shown with the mapping paths).
    """
    out: list[Finding] = []
    empty = empty_results_problem(result, spec, where="config as found")
    if empty is not None:
        out.append(Finding("empty_results", "stop", empty + _empty_evidence(result, spec, raw_response)))
    else:
        out.extend(_check_label_match(result))
    out.extend(_check_handoff(result, gate_values or {}, gates_solved))
    out.extend(_check_coverage(result))
    out.extend(_check_duplicates(result))
    return out


def empty_results_problem(result: BatchResult, spec: EvalSpec, *, where: str = "batch") -> str | None:
    """One line when more than ``spec.max_empty_share`` of the in-scope queries that got
    an answer came back with no results (None otherwise). Used by the preflight and by
    every trial: a mostly empty batch is a broken request or mapping, not a bad config."""
    ins = [q.query_id for q in result.queries if q.scope != "oos"]
    answered = [qid for qid in ins if result.per_query.at[qid, "status"] == "ok"]
    return empty_share_problem([qid for qid in answered if not result.hits.get(qid)], len(answered), spec, where=where)


def empty_share_problem(empty: list[str], answered: int, spec: EvalSpec, *, where: str = "batch") -> str | None:
    """``empty_results_problem`` on counts: ``empty`` in-scope query ids answered with no
    results (in query order) out of ``answered``."""
    if not answered or len(empty) / answered <= spec.max_empty_share:
        return None
    return (
        f"{where}: {len(empty)} of {answered} in-scope queries came back with no results "
        f"(first: {', '.join(empty[:3])})"
    )


def _empty_evidence(result: BatchResult, spec: EvalSpec, raw_response: Callable[[str], str] | None) -> str:
    first = next(
        q.query_id
        for q in result.queries
        if q.scope != "oos" and not result.hits.get(q.query_id) and result.per_query.at[q.query_id, "status"] == "ok"
    )
    r = spec.response
    parts = [f"mapping tried results_path={r.results_path!r}, doc_id={r.doc_id!r}"]
    if raw_response is not None:
        parts.append(f"raw response to {first}: {_clip(raw_response(first), 240)}")
    fix = "fix evaluation.request.body or evaluation.response.results_path"
    if not sends_query_id(spec):
        fix += (
            "; the request body does not send query_id, which a backend with run sources needs to look its "
            'runs up (add query_id: "{query_id}")'
        )
    return "; " + "; ".join(parts) + "; " + fix


def _check_label_match(result: BatchResult) -> list[Finding]:
    """Returned doc ids that match no label at all: an id field or id format mismatch."""
    labelled = {doc for docs in result.qrels.values() for doc in docs}
    returned = [h.doc_id for q in result.queries if q.scope != "oos" for h in result.hits.get(q.query_id, ())]
    if not returned or not labelled or labelled.intersection(returned):
        return []
    shown = ", ".join(repr(d) for d in list(dict.fromkeys(returned))[:3])
    labels = ", ".join(repr(d) for d in sorted(labelled)[:3])
    return [
        Finding(
            "no_label_match",
            "stop",
            f"none of the {len(returned)} returned doc ids matches a labelled doc id (returned: {shown}; labelled: "
            f"{labels}); point evaluation.response.doc_id at the field holding the labels' ids, or fix the id format",
        )
    ]


def _check_handoff(result: BatchResult, gate_values: Mapping[str, Any], gates_solved: bool) -> list[Finding]:
    pq = result.per_query
    ins = pq[(pq["scope"] != "oos") & (pq["status"] == "ok")]
    if not len(ins):
        return []
    handed = ins[~ins["answered"].astype(bool)]
    share = len(handed) / len(ins)
    fact = f"the config as found hands off {len(handed)} of {len(ins)} in-scope queries ({share:.1%})"
    if not len(handed):
        return [Finding("handoff", "info", fact)]
    cause = _handoff_cause(handed, gate_values)
    if share > MOST and gates_solved:
        return [
            Finding(
                "handoff",
                "warn",
                f"{fact}{cause}; the study solves the gates per trial, but the baseline "
                "trial and `tuner eval` measure this config",
            )
        ]
    if share > MOST:
        return [
            Finding(
                "handoff",
                "stop",
                f"{fact}{cause}: the scores would measure the gate, not the ranking; "
                "lower that setting in the config, or solve it per trial (post_retrieval / gate: "
                "in the space)",
            )
        ]
    if share > HANDOFF_WARN:
        return [Finding("handoff", "warn", f"{fact}{cause}; each handed-off query scores 0")]
    return [Finding("handoff", "info", fact + cause)]


def _handoff_cause(handed: Any, gate_values: Mapping[str, Any]) -> str:
    """The config key responsible, where the response says so (else the gates as found)."""
    reasons = [r for r in handed.get("handoff_reason", []) if isinstance(r, str) and r]
    if reasons:
        # reasons carry per-query values ("confidence 0.41 < confidence.threshold 0.60"):
        # count them by the config key they name
        keys = Counter(_CONFIG_KEY.findall(r)[-1] if _CONFIG_KEY.search(r) else r for r in reasons)
        key, n = keys.most_common(1)[0]
        example = next(r for r in reasons if key in r)
        if key == example:  # the reason names no config key: quote it once
            return f"; {n} with reason: {_clip(example, 120)}"
        return f"; {n} by {key} (e.g. {_clip(example, 100)})"
    if gate_values:
        return "; gates as found: " + ", ".join(f"{k} = {v}" for k, v in gate_values.items())
    return ""


def check_oos_movable(
    result: BatchResult, constraints: Sequence[Any], *, tuned_keys: Iterable[str], gates: Sequence[Any] = ()
) -> list[Finding]:
    """An OOS constraint whose metric no trial can move: "feasible" then says nothing.

    On the batch of the config as found: OOS queries handed off for a reason that names
    no tuned config key (``no candidates``: no source ranks them) are handed off under
    every config. All of them so: a stop when every reason names no config key at all
    (the backend says nothing configurable is responsible), a warning when a reason names
    only untuned keys (a tuned key may still move what they read). Some of them: a
    warning, the metric measures the others only. Otherwise, with ``gates`` (the solved
    post-retrieval gates, tuner.study.gates.threshold.GateRange), the batch is re-gated at both
    ends of their ranges (tuner.evaluation.regate): the same metric at both ends is a
    warning, as the retrieval keys of other trials may still move it."""
    bound = [c for c in constraints if c.metric in OOS_DENOMINATOR_METRICS]
    pq = result.per_query
    oos = pq[(pq["scope"] == "oos") & (pq["status"] == "ok")]
    if not bound or not len(oos):
        return []
    names = ", ".join(repr(c.name) for c in bound)
    keys = list(tuned_keys)
    handed = oos[~oos["answered"].astype(bool)]
    reasons = [r for r in handed["handoff_reason"].tolist() if isinstance(r, str) and r]
    stuck = [r for r in reasons if not _names_tuned_key(r, keys)]
    if stuck:
        example = f"e.g. {_clip(Counter(stuck).most_common(1)[0][0], 100)}"
        if len(stuck) == len(oos):
            certain = not any(_CONFIG_KEY.search(r) for r in stuck)
            metric = bound[0].metric
            return [
                Finding(
                    "oos_cannot_vary",
                    "stop" if certain else "warn",
                    f"constraint {names} cannot vary: all {len(oos)} out-of-scope queries are handed off on the config "
                    f"as found for a reason no tuned key controls ({example}), so {metric} stays "
                    f"{float(result.metrics.get(metric, math.nan)):.3f} under every config and every trial counts as "
                    "feasible; make the backend retrieve for them (e.g. runs that rank the out-of-scope queries too), "
                    "or remove the constraint",
                )
            ]
        out = [
            Finding(
                "oos_partly_fixed",
                "warn",
                f"{len(stuck)} of {len(oos)} out-of-scope queries are handed off on the config as found for a "
                f"reason no tuned key controls ({example}): every trial hands them off, so {names} measures the other "
                f"{len(oos) - len(stuck)} only; make the backend retrieve for them, or drop them from the query set",
            )
        ]
    else:
        out = []
    return out + _gate_range_findings(result, bound, gates)


def _names_tuned_key(reason: str, tuned_keys: Sequence[str]) -> bool:
    """Does the reason name a config key the study tunes (or a key under one, or above one)?"""
    named = _CONFIG_KEY.findall(reason)
    return any(n == k or n.startswith(k + ".") or k.startswith(n + ".") for n in named for k in tuned_keys)


def _gate_range_findings(result: BatchResult, bound: Sequence[Any], gates: Sequence[Any]) -> list[Finding]:
    """The constraints' metrics with every gate at the low and at the high end of its range."""
    from tuner.evaluation.regate import regate

    by_role = {g.role: g for g in gates}
    conf, cut = by_role.get("confidence"), by_role.get("min_score")
    if conf is None and cut is None:
        return []
    ends = [
        regate(result, confidence_threshold=getattr(conf, end, None), min_score=getattr(cut, end, None)).metrics
        for end in ("low", "high")
    ]
    ranges = ", ".join(f"{g.param} {g.low:g}..{g.high:g}" for g in (conf, cut) if g is not None)
    out = []
    for c in bound:
        low, high = (float(m.get(c.metric, math.nan)) for m in ends)
        if math.isnan(low) or low != high:
            continue
        out.append(
            Finding(
                "oos_gate_flat",
                "warn",
                f"constraint {c.name!r}: {c.metric} is {low:.3f} on the config as found with the gates at both ends "
                f"of their ranges ({ranges}), so the gates cannot move it and only the other tuned keys might; look at "
                "the out-of-scope queries' confidences and scores (`tuner eval`'s per-query CSV), or widen the "
                "gates' ranges",
            )
        )
    return out


def _check_coverage(result: BatchResult) -> list[Finding]:
    j10 = result.metrics.get("Judged@10", math.nan)
    if math.isnan(j10) or j10 >= LOW_COVERAGE:
        return []
    return [
        Finding(
            "low_coverage",
            "warn",
            f"Judged@10 = {j10:.2f}: most shown hits have no label and count as Irrelevant, so scores understate "
            "every config alike and differences shrink; judge more (tuner labels queue)",
        )
    ]


def _check_duplicates(result: BatchResult) -> list[Finding]:
    # the answers' repeats were removed when they were parsed (tuner.evaluation.mapping): counted per query
    dup = [str(q) for q, n in result.per_query["n_repeats"].items() if n]
    if not dup:
        return []
    return [
        Finding(
            "duplicate_ids",
            "warn",
            f"{len(dup)} queries return the same doc id twice (first: {dup[0]}); repeats are credited once: "
            f"{result.repeated_hits} later copies were removed before ranking (per query: n_repeats), "
            "so the backend shows fewer distinct results than top_k",
        )
    ]


# ------------------------------------------------------------------ helpers


def _placeholders(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield from _PLACEHOLDER.findall(node)
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _placeholders(value)
    elif isinstance(node, list):
        for value in node:
            yield from _placeholders(value)


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
