"""The stacked bound of a replayed grid (ReplayContext.bound: settings replayed a chunk at a time,
ReplayBatch.stacked, tuner.study.gates.threshold.bound_stacked) against its oracle, each setting
replayed and bounded on its own (ReplayContext.bound_each: ReplayBatch.table + bound_arrays):
on random batches with tied scores, empty and missing lists, failed and OOS queries, a
top_k that cuts, score cuts above the lowest candidates, recency and every fusion method,
each bound is the oracle's to the last bit (feasibility and upper), and each stacked
replay holds the hits, scores, grades, confidence and handoff of the setting's table."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from tuner.config.objective import Constraint
from tuner.errors import ConfigError
from tuner.evaluation.fusion_replay import Explained, FusionSetting
from tuner.evaluation.replay_batch import ReplayBatch
from tuner.study.gates.threshold import GateBound, GateRange
from tuner.study.replay.replay_pool import ReplayContext


def explanation(rng: random.Random, n_docs: int, coarse: bool) -> dict[str, Any]:
    """One query's explanation: two tiers, lists that may be empty or absent, scores on a
    coarse scale (ties within and across lists) or a fine one."""
    docs: dict[str, Any] = {}
    tiers = []
    for level in ("primary", "no_filter"):
        sources: dict[str, Any] = {}
        for name in ("bm25", "dense"):
            if rng.random() < 0.1:
                continue  # the source lists nothing at this tier
            picked = rng.sample(range(n_docs), rng.randint(0, 30))
            scores = sorted(
                (float(rng.randint(0, 4)) if coarse else round(rng.random() * 10, 6) for _ in picked), reverse=True
            )
            sources[name] = {"docs": picked, "scores": scores}
            for d in picked:
                docs[str(d)] = {
                    "doc_id": f"D{d}",
                    "title": None,
                    "date": None,
                    "day": rng.choice([None, 19000 + rng.randint(0, 400)]),
                    "similarity": rng.choice([0.5, 0.25, rng.random()]),  # ties in the confidence too
                }
        tiers.append({"level": level, "sources": sources})
    return {
        "sources": ["bm25", "dense"],
        "tiers": tiers,
        "docs": docs,
        "fusion": {"method": "rrf", "weights": {"bm25": 1, "dense": 1}, "rrf_k": 60, "normalization": "minmax"},
        "recency": {"weight": 0.0, "half_life_days": 30, "today": 19400},
        "confidence": {"threshold": 0.0, "top_m": 3},
        "citation": {"min_score": 0.0},
    }


GATES = {
    "both": {
        "confidence.threshold": GateRange("confidence.threshold", 0.0, 0.9, 0.05),
        "citation.min_score": GateRange("citation.min_score", 0.0, 0.5, 0.02),
    },
    "cut only": {"citation.min_score": GateRange("citation.min_score", 0.0, 0.8, 0.05)},
    "confidence only": {"confidence.threshold": GateRange("confidence.threshold", 0.1, 0.7, 0.1)},
}
CONSTRAINTS = [
    [],
    [Constraint.parse("OOS_FP_Rate <= 0.3")],
    [Constraint.parse("OOS_FP_Rate <= 0.2"), Constraint.parse("Answer_Recall >= 0.4")],
    [Constraint.parse("OOS_FP_Rate <= -1")],  # infeasible everywhere
]


def context(seed: int, gates: str, objective: str, constraints: list[Any], top_k: int) -> ReplayContext:
    rng = random.Random(seed)
    n_q, n_docs = rng.randint(8, 40), rng.choice([40, 150])
    ids = tuple(f"q{i}" for i in range(n_q))
    coarse = seed % 2 == 0
    explained = {q: Explained.parse(explanation(rng, n_docs, coarse), q) for q in ids if rng.random() > 0.1}
    qrels = {q: {f"D{d}": rng.randint(0, 3) for d in rng.sample(range(n_docs), 15)} for q in ids if rng.random() > 0.1}
    is_oos = tuple(rng.random() < 0.25 for _ in ids)
    return ReplayContext(
        explained, ids, is_oos, qrels, top_k, "exp" if seed % 3 == 0 else "linear", GATES[gates], objective, constraints
    )


def settings(seed: int) -> list[FusionSetting]:
    rng = random.Random(1000 + seed)
    out = []
    for w in (0.0, 0.25, 0.5, 1.0):
        for k in (1.0, 7.0, 60.0):
            for method, norm in (("rrf", "minmax"), ("linear", "minmax"), ("linear", "z")):
                out.append(
                    FusionSetting(
                        method=method,  # type: ignore[arg-type]
                        weights={"bm25": w, "dense": 1.0 - w},
                        rrf_k=k,
                        normalization=norm,  # type: ignore[arg-type]
                        recency_weight=rng.choice([0.0, 0.0, 0.3]),
                        recency_half_life_days=rng.choice([30.0, 7.0]),
                        top_m=rng.randint(1, 5),
                        min_score=rng.choice([0.0, 0.0, 0.01]),  # a cut above the lowest candidates
                        plain_sum=rng.random() < 0.1,
                    )
                )
    out.append(FusionSetting(weights={"bm25": 0.0, "dense": 0.0}))  # no source: no candidate anywhere
    rng.shuffle(out)  # active patterns interleaved: the stacked chunks regroup them
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gates", list(GATES))
def test_the_stacked_bound_is_the_oracles_to_the_last_bit(seed: int, gates: str) -> None:
    objective = ["Primary_Metric_Score", "NDCG@10", "ERR@20", "Recall@50"][seed % 4]
    grid = settings(seed)
    seen: set[tuple[bool, float]] = set()
    for constraints in CONSTRAINTS:
        ctx = context(seed, gates, objective, constraints, top_k=[5, 20, 50][seed % 3])
        got, want = ctx.bound(grid), ctx.bound_each(grid)
        assert got == want
        assert all(isinstance(b, GateBound) for b in got)
        seen.update((b.feasible, b.upper == -np.inf) for b in got)
    assert (True, False) in seen and (False, True) in seen  # feasible and infeasible settings both occur


@pytest.mark.parametrize(
    ("why", "objective", "constraints"),
    [
        ("coverage can rise as a list gets shorter", "Judged@10", []),
        (
            "a constraint on the objective itself",
            "Primary_Metric_Score",
            [Constraint.parse("Primary_Metric_Score >= 0.1")],
        ),
    ],
)
def test_no_bound_where_none_holds_as_the_oracle(why: str, objective: str, constraints: list[Any]) -> None:
    ctx = context(3, "both", objective, constraints, top_k=20)
    grid = settings(3)[:12]
    assert ctx.bound(grid) == ctx.bound_each(grid) == [None] * len(grid), why


def test_a_constraint_on_a_column_the_sweep_lacks_is_refused_as_the_oracle_refuses_it() -> None:
    ctx = context(2, "both", "Primary_Metric_Score", [Constraint.parse("No_Such_Rate <= 0.1")], top_k=20)
    grid = settings(2)[:6]
    with pytest.raises(ConfigError) as want:
        ctx.bound_each(grid)
    with pytest.raises(ConfigError) as got:
        ctx.bound(grid)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("seed", range(6))
def test_each_stacked_replay_holds_the_settings_table(seed: int) -> None:
    ctx = context(seed, "both", "Primary_Metric_Score", [], top_k=[5, 20, 50][seed % 3])
    batch = ReplayBatch(ctx.explained, ctx.query_ids, ~np.asarray(ctx.is_oos), ctx.qrels, ctx.top_k)
    grid = settings(seed)
    covered = []
    n_q = len(ctx.query_ids)
    for where, stack in batch.stacked(grid, chunk=5):
        assert stack.n == len(where)
        for s, i in enumerate(where):
            r = batch.table(grid[i])
            rows = slice(s * n_q, (s + 1) * n_q)
            np.testing.assert_array_equal(stack.counts[rows], r.table.counts)
            hits = np.concatenate(
                [np.arange(a, a + n) for a, n in zip(stack.starts[rows], stack.counts[rows], strict=True)] or [[]]
            ).astype(np.int64)
            np.testing.assert_array_equal(stack.scores[hits], r.table.scores)  # bit for bit
            np.testing.assert_array_equal(stack.grades[hits], r.table.grades)
            np.testing.assert_array_equal(stack.confidence[s], r.confidence)
            np.testing.assert_array_equal(stack.handoff[s], r.handoff)
            covered.append(i)
    assert sorted(covered) == list(range(len(grid)))
