"""Benchmark: the full scorecard vs pytrec_eval on the same graded input at the same depth.

A 10,000-query run is generated --depth deep, then truncated to the scorecard's
deepest cutoff (50) *before* either side sees it, so both read the same ranked
documents: our rankings lists and pytrec_eval's run dict hold the same top 50 of
every query (scores strictly descending, so trec_eval's tie order cannot reorder
them). Both start from their natural Python input and end with per-query values, so
both include their own preparation.

pytrec_eval computes ndcg_cut, P and recip_rank at the scorecard's cutoffs
(recip_rank on the 50-deep run = reciprocal rank within 50). We compute every primary
+ secondary metric, Primary_Metric_Score, and the three pytrec_eval measures the
scorecard does not hold (P@10, P@20, MRR@50), so our side does a superset of
pytrec_eval's work. The two sides run --repeat times, interleaved in one process;
medians, their ratio and a value check (max |ours - pytrec_eval| over the queries, per
shared measure, from the timed outputs themselves) are printed.

    .venv/bin/python bench/metrics_bench.py [--queries 10000] [--depth 100] [--repeat 5]

Goal: ratio (ours / pytrec_eval) <= 0.5.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from tuner.metrics import DEFAULT_METRICS, resolve, score_rankings

# pytrec_eval measure -> our metric on the same values (relevance level 1).
SHARED = {
    "ndcg_cut_5": "NDCG@5", "ndcg_cut_10": "NDCG@10", "ndcg_cut_20": "NDCG@20", "ndcg_cut_50": "NDCG@50",
    "P_1": "P@1", "P_10": "P@10", "P_20": "P@20", "P_50": "Useful_Precision@50",
    "recip_rank": "MRR@50",
}
PYTREC_MEASURES = {"ndcg_cut.5,10,20,50", "P.1,10,20,50", "recip_rank"}
OUR_METRICS = list(dict.fromkeys([*DEFAULT_METRICS, *SHARED.values()]))
SCORECARD_DEPTH = max(resolve(name).k for name in OUR_METRICS)  # every metric here has a cutoff


def make_input(n_queries: int, depth: int, seed: int = 0):
    """Graded qrels (about 1.5 x depth judged docs per query) and a scored run per query."""
    rng = np.random.default_rng(seed)
    corpus = np.array([f"doc{i:07d}" for i in range(200_000)])
    qrels: dict[str, dict[str, int]] = {}
    rankings: dict[str, list[str]] = {}
    n_judged = depth + depth // 2
    for q in range(n_queries):
        qid = f"q{q}"
        docs = corpus[rng.choice(corpus.size, n_judged + depth, replace=False)]
        grades = rng.choice(4, n_judged, p=[0.55, 0.2, 0.15, 0.1])
        qrels[qid] = dict(zip(docs[:n_judged].tolist(), grades.tolist()))
        # 70% of the ranking judged, the rest unjudged documents.
        ranked = rng.permutation(np.concatenate([docs[: int(depth * 0.7)], docs[n_judged: n_judged + depth - int(depth * 0.7)]]))
        rankings[qid] = ranked.tolist()
    return qrels, rankings


def truncate(rankings: dict[str, list[str]], depth: int) -> tuple[dict[str, list[str]], dict[str, dict[str, float]]]:
    """The same top ``depth`` of every ranking, as our lists and as pytrec_eval's run dict
    (distinct, strictly descending scores: the dict's order is the list's order)."""
    cut = {qid: docs[:depth] for qid, docs in rankings.items()}
    scores = np.linspace(1.0, 0.01, depth).tolist()
    return cut, {qid: dict(zip(docs, scores)) for qid, docs in cut.items()}


def run_ours(qrels, rankings, query_ids) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    scores = score_rankings(rankings, qrels, query_ids, metrics=OUR_METRICS)
    elapsed = time.perf_counter() - start
    assert len(scores) == len(query_ids)
    return elapsed, scores


def run_pytrec(qrels, run) -> tuple[float, dict[str, dict[str, float]]]:
    import pytrec_eval

    start = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES)
    results = evaluator.evaluate(run)
    elapsed = time.perf_counter() - start
    assert len(results) == len(run)
    return elapsed, results


def max_differences(ours: pd.DataFrame, theirs: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per shared measure: max over the queries of |ours - pytrec_eval|."""
    qids = list(theirs)
    return {measure: float(np.max(np.abs(ours.loc[qids, metric].to_numpy()
                                         - np.array([theirs[q][measure] for q in qids]))))
            for measure, metric in SHARED.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=100, help="generated run depth (then cut to the scorecard's)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    qrels, full = make_input(args.queries, args.depth)
    depth = min(args.depth, SCORECARD_DEPTH)
    rankings, run = truncate(full, depth)
    query_ids = list(rankings)
    warm = query_ids[:100]  # warm imports and caches on both sides
    run_ours(qrels, {q: rankings[q] for q in warm}, warm)
    run_pytrec({q: qrels[q] for q in warm}, {q: run[q] for q in warm})

    ours, theirs = [], []
    for _ in range(args.repeat):
        elapsed, our_scores = run_ours(qrels, rankings, query_ids)
        ours.append(elapsed)
        elapsed, their_scores = run_pytrec(qrels, run)
        theirs.append(elapsed)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    diffs = max_differences(our_scores, their_scores)

    print(f"input: {args.queries} queries, generated {args.depth} deep, both sides given the same top {depth} "
          f"(scorecard depth), graded 0..3, {args.repeat} interleaved repeats (median)")
    print(f"tuner.metrics  {len(OUR_METRICS)} metrics + Primary_Metric_Score "
          f"(scorecard {len(DEFAULT_METRICS)} + P@10, P@20, MRR@50): {ours_s:.3f} s")
    print(f"pytrec_eval    {', '.join(sorted(PYTREC_MEASURES))}: {theirs_s:.3f} s")
    print(f"ratio ours / pytrec_eval = {ours_s / theirs_s:.2f} (goal <= 0.5)")
    print(f"value check, max |ours - pytrec_eval| over {len(their_scores)} queries:")
    for measure, metric in SHARED.items():
        print(f"  {measure:<12} vs {metric:<20} {diffs[measure]:.2e}")
    worst = max(diffs.values())
    print(f"values {'agree' if worst <= 1e-9 else 'DIFFER'} (worst {worst:.2e}, tolerance 1e-9)")


if __name__ == "__main__":
    main()
