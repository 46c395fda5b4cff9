"""Benchmark: the full scorecard vs pytrec_eval on the same 10,000 x 100 graded input.

Both sides start from their natural Python input (our rankings lists + qrels dicts;
pytrec_eval's qrels and run dicts) and end with per-query values, so both include
their own preparation. pytrec_eval computes ndcg_cut, P and recip_rank at the
cutoffs the scorecard uses; we compute every primary + secondary metric and
Primary_Metric_Score. Each side runs --repeat times, interleaved; medians are printed.

    .venv/bin/python bench/metrics_bench.py [--queries 10000] [--depth 100] [--repeat 5]

Goal: ratio (ours / pytrec_eval) <= 0.5.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tuner.metrics import DEFAULT_METRICS, score_rankings

PYTREC_MEASURES = {"ndcg_cut.5,10,20,50", "P.1,10,20,50", "recip_rank"}


def make_input(n_queries: int, depth: int, seed: int = 0):
    """Graded qrels (about 1.5 x depth judged docs per query) and a scored run per query."""
    rng = np.random.default_rng(seed)
    corpus = np.array([f"doc{i:07d}" for i in range(200_000)])
    qrels: dict[str, dict[str, int]] = {}
    rankings: dict[str, list[str]] = {}
    run: dict[str, dict[str, float]] = {}
    n_judged = depth + depth // 2
    for q in range(n_queries):
        qid = f"q{q}"
        docs = corpus[rng.choice(corpus.size, n_judged + depth, replace=False)]
        grades = rng.choice(4, n_judged, p=[0.55, 0.2, 0.15, 0.1])
        qrels[qid] = dict(zip(docs[:n_judged].tolist(), grades.tolist()))
        # 70% of the ranking judged, the rest unjudged documents.
        ranked = rng.permutation(np.concatenate([docs[: int(depth * 0.7)], docs[n_judged: n_judged + depth - int(depth * 0.7)]]))
        rankings[qid] = ranked.tolist()
        run[qid] = dict(zip(rankings[qid], np.linspace(1.0, 0.01, depth).tolist()))
    return qrels, rankings, run


def time_ours(qrels, rankings, query_ids) -> float:
    start = time.perf_counter()
    scores = score_rankings(rankings, qrels, query_ids, metrics=list(DEFAULT_METRICS))
    elapsed = time.perf_counter() - start
    assert len(scores) == len(query_ids)
    return elapsed


def time_pytrec(qrels, run) -> float:
    import pytrec_eval

    start = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES)
    results = evaluator.evaluate(run)
    elapsed = time.perf_counter() - start
    assert len(results) == len(run)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    qrels, rankings, run = make_input(args.queries, args.depth)
    query_ids = list(rankings)
    time_ours(qrels, rankings, query_ids[:100])  # warm imports and caches on both sides
    time_pytrec({q: qrels[q] for q in query_ids[:100]}, {q: run[q] for q in query_ids[:100]})

    ours, theirs = [], []
    for _ in range(args.repeat):
        ours.append(time_ours(qrels, rankings, query_ids))
        theirs.append(time_pytrec(qrels, run))
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    print(f"input: {args.queries} queries x {args.depth} results, graded 0..3, {args.repeat} repeats (median)")
    print(f"tuner.metrics  full scorecard ({len(DEFAULT_METRICS)} metrics + Primary_Metric_Score): {ours_s:.3f} s")
    print(f"pytrec_eval    {', '.join(sorted(PYTREC_MEASURES))}: {theirs_s:.3f} s")
    print(f"ratio ours / pytrec_eval = {ours_s / theirs_s:.2f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
