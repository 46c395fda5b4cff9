"""Cross-check the scorecard against independent implementations on random graded runs.

pytrec_eval runs trec_eval's own C code (including its tie order: score descending,
docno descending), ranx its numba code, ir_measures' gdeval provider the TREC Web
track's gdeval.pl (perl). Where none of them has a metric, the expected value is the
formula, written here as a plain loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
from support.integration import need

from tuner.data.runs import parse_trec_run
from tuner.metrics import prepare, score_batch, score_rankings

N_QUERIES = 60


def library(module: str, package: str) -> ModuleType:
    """The reference implementation ``module``, or skip (fail under CI) naming its pip package."""
    try:
        return importlib.import_module(module)
    except ImportError:
        need(False, f"{module} is not installed: pip install {package} (in the test extra: pip install -e '.[test]')")
        raise


@pytest.fixture
def pytrec_eval() -> ModuleType:
    return library("pytrec_eval", "pytrec-eval-terrier")


# ranx compiles each metric with numba on first use: about 50 s of CPU in a fresh venv
# (numba's cache sits beside ranx's source in site-packages, new with every install) to
# score 60 queries that ranx's own Python code scores in a second or two. The reference is
# computed by a child with NUMBA_DISABLE_JIT=1: the same ranx code, interpreted.
RANX_REFERENCE = """
import json, sys, warnings
import ranx
qrels, run, measures = json.load(sys.stdin)
ranx_qrels, ranx_run = ranx.Qrels(qrels), ranx.Run(run)
order = list(ranx_run.keys())  # ranx returns per-query arrays in its run's query order
assert order == list(ranx_qrels.keys()), "ranx ordered the qrels and the run differently"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # numba parallel warnings on tiny inputs
    scores = ranx.evaluate(ranx_qrels, ranx_run, measures, return_mean=False)
print(json.dumps({m: dict(zip(order, map(float, scores[m]))) for m in measures}))
"""


@pytest.fixture
def ranx() -> Callable[..., dict[str, dict[str, float]]]:
    """``reference(qrels, run, measures)``: ranx's per-query scores (measure -> query -> score)."""
    if importlib.util.find_spec("ranx") is None:
        library("ranx", "ranx")  # skips (fails under CI) naming the package

    def reference(qrels, run, measures):
        done = subprocess.run([sys.executable, "-c", RANX_REFERENCE], input=json.dumps([qrels, run, measures]),
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "NUMBA_DISABLE_JIT": "1"})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    return reference


@pytest.fixture
def ir_measures() -> ModuleType:
    return library("ir_measures", "ir-measures")


def random_collection(seed: int, ties: bool):
    """qrels (grades 0..3, numeric query ids for gdeval) and a scored run with some empty queries."""
    rng = np.random.default_rng(seed)
    docs = [f"D{i:04d}" for i in range(300)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(1, N_QUERIES + 1):
        qid = str(q)
        judged = rng.choice(docs, int(rng.integers(1, 80)), replace=False)
        qrels[qid] = {str(d): int(g) for d, g in zip(judged, rng.choice(4, judged.size, p=[0.5, 0.2, 0.2, 0.1]))}
        if q % 10 == 0:
            continue  # handed off: no results at all
        # Retrieve mostly judged documents so that every metric sees hits.
        pool = list(judged) + list(rng.choice(docs, 40, replace=False))
        retrieved = list(dict.fromkeys(rng.permutation(pool)))[: int(rng.integers(1, 100))]
        raw = rng.random(len(retrieved))
        scores = np.round(raw, 1) if ties else raw
        run[qid] = {str(d): float(s) for d, s in zip(retrieved, scores)}
    return qrels, run


def rankings_of(run: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """Order through our TREC run reader, so its tie order is under test too."""
    lines = [f"{q} Q0 {d} 0 {s!r} tag" for q, docs in run.items() for d, s in docs.items()]
    return parse_trec_run(lines, source="<generated>").rankings


def ours(qrels, run, metrics, gains="linear", max_grade=3, relevance_level=1):
    batch = prepare(rankings_of(run), qrels, list(qrels), gains=gains, max_grade=max_grade,
                    relevance_level=relevance_level)
    return score_batch(batch, metrics)


def assert_close(got, expected, what, tol=1e-9):
    bad = {q: (got[q], expected[q]) for q in expected if not math.isclose(got[q], expected[q], abs_tol=tol)}
    assert not bad, f"{what}: {len(bad)} queries differ (ours, reference): {dict(list(bad.items())[:3])}"


# trec_eval measure -> our metric, at trec_eval's relevance level (-l).
PYTREC_EQUIVALENTS = {
    1: {"ndcg": "NDCG", "ndcg_cut_5": "NDCG@5", "ndcg_cut_10": "NDCG@10", "ndcg_cut_20": "NDCG@20",
        "ndcg_cut_50": "NDCG@50", "P_1": "P@1", "P_10": "P@10", "P_50": "Useful_Precision@50",
        "recall_50": "Recall@50", "recip_rank": "MRR", "map": "AP", "map_cut_10": "AP@10",
        "success_1": "Success@1", "success_10": "Success@10"},
    2: {"P_10": "Strong_Precision@10", "P_20": "Strong_Precision@20", "success_10": "Strong_Success@10",
        "recip_rank": "MRR_Strong"},
    3: {"P_10": "Exact_Precision@10", "success_10": "Exact_Success@10", "recip_rank": "MRR_Exact"},
}


# Families that follow relevance_level, compared with trec_eval run at the same -l;
# ndcg is here because trec_eval's ignores -l and so must ours.
AT_RELEVANCE_LEVEL = {"P_10": "P@10", "P_50": "P@50", "recall_50": "Recall@50", "map": "AP",
                      "map_cut_10": "AP@10", "recip_rank": "MRR", "success_10": "Success@10",
                      "ndcg_cut_10": "NDCG@10", "ndcg": "NDCG"}


def pytrec_reference(pytrec_eval, qrels, run, measures, level):
    names = set()
    for measure in measures:  # "P_10" -> "P.10": pytrec_eval names its cutoffs explicitly
        base, _, cutoff = measure.rpartition("_")
        names.add(f"{base}.{cutoff}" if cutoff.isdigit() else measure)
    return pytrec_eval.RelevanceEvaluator(qrels, names, relevance_level=level).evaluate(run)


@pytest.mark.parametrize("level", sorted(PYTREC_EQUIVALENTS))
def test_against_pytrec_eval_with_tied_scores(pytrec_eval, level):
    qrels, run = random_collection(seed=level, ties=True)
    equivalents = PYTREC_EQUIVALENTS[level]
    reference = pytrec_reference(pytrec_eval, qrels, run, equivalents, level)
    scores = ours(qrels, run, list(equivalents.values()))
    for measure, metric in equivalents.items():
        expected = {q: values[measure] for q, values in reference.items()}
        assert_close(scores[metric], expected, f"{metric} vs trec_eval {measure} -l{level}")
    handed_off = [q for q in qrels if q not in run]
    assert handed_off and (scores.loc[handed_off].to_numpy() == 0).all()


@pytest.mark.parametrize("level", [1, 2, 3])
def test_relevance_level_against_pytrec_eval(pytrec_eval, level):
    qrels, run = random_collection(seed=20 + level, ties=True)
    reference = pytrec_reference(pytrec_eval, qrels, run, AT_RELEVANCE_LEVEL, level)
    scores = ours(qrels, run, list(AT_RELEVANCE_LEVEL.values()), relevance_level=level)
    for measure, metric in AT_RELEVANCE_LEVEL.items():
        expected = {q: values[measure] for q, values in reference.items()}
        assert_close(scores[metric], expected, f"{metric} at relevance_level={level} vs trec_eval {measure} -l{level}")


def test_against_ranx_exp_gains_and_cut_reciprocal_ranks(ranx):
    qrels, run = random_collection(seed=11, ties=False)
    in_run = {q: qrels[q] for q in run}
    equivalents = {"ndcg_burges@10": "NDCG@10", "ndcg_burges@20": "NDCG@20",
                   "mrr@10-l2": "MRR_Strong@10", "mrr@10-l3": "MRR_Exact@10",
                   "hit_rate@10-l2": "Strong_Success@10", "precision@20-l2": "Strong_Precision@20",
                   "recall@50": "Recall@50"}
    reference = ranx(in_run, run, list(equivalents))
    scores = ours(qrels, run, list(equivalents.values()), gains="exp")
    for measure, metric in equivalents.items():
        assert set(reference[measure]) == set(run), measure
        assert_close(scores[metric], reference[measure], f"{metric} (exp gains) vs ranx {measure}")


def test_err_and_exp_ndcg_against_gdeval(ir_measures):
    need(shutil.which("perl") is not None, "ir_measures' gdeval provider runs gdeval.pl, which needs perl")
    qrels, run = random_collection(seed=5, ties=True)
    cutoffs = (5, 10, 20)
    measures = [ir_measures.ERR @ k for k in cutoffs] + [ir_measures.nDCG @ k for k in cutoffs]
    reference = {(str(m.measure), m.query_id): m.value for m in ir_measures.gdeval.iter_calc(measures, qrels, run)}
    # gdeval fixes the top grade at 4: stop probability (2^g - 1) / 2^4, which our
    # gain(g) / (gain(max) + 1) matches with exp gains on a 0..4 scale.
    metrics = [f"ERR@{k}" for k in cutoffs] + [f"NDCG@{k}" for k in cutoffs]
    scores = ours(qrels, run, metrics, gains="exp", max_grade=4)
    for k in cutoffs:
        for ours_name, theirs in ((f"ERR@{k}", f"ERR@{k}"), (f"NDCG@{k}", f"nDCG@{k}")):
            expected = {q: v for (m, q), v in reference.items() if m == theirs}
            assert len(expected) == len(qrels)  # handed-off queries included, at 0
            assert_close(scores[ours_name], expected, f"{ours_name} vs gdeval", tol=1e-5)  # 5 printed decimals


def test_judged_against_ir_measures(ir_measures):
    # ir_measures' judged provider does not break score ties like trec_eval: no ties here.
    qrels, run = random_collection(seed=3, ties=False)
    reference = {m.query_id: m.value for m in ir_measures.judged.iter_calc([ir_measures.Judged @ 10], qrels, run)}
    scores = ours(qrels, run, ["Judged@10"])
    assert_close(scores["Judged@10"], {q: reference[q] for q in run}, "Judged@10 vs ir_measures")


def test_metrics_without_a_library_equivalent_follow_their_formulas():
    qrels, run = random_collection(seed=17, ties=True)
    rankings = rankings_of(run)
    for gains, gain in (("linear", lambda g: g), ("exp", lambda g: 2**g - 1)):
        scores = score_rankings(rankings, qrels, list(qrels), gains=gains,
                                metrics=["Avg_Grade@10", "Gain_Recall@20", "MAP@10", "ERR@10"])
        for qid in qrels:
            grades = [qrels[qid].get(doc, 0) for doc in rankings.get(qid, [])]
            top10 = (grades + [0] * 10)[:10]
            assert scores.loc[qid, "Avg_Grade@10"] == pytest.approx(sum(top10) / 10)
            total = sum(gain(g) for g in qrels[qid].values())
            expected_recall = sum(gain(g) for g in grades[:20]) / total if total else 0.0
            assert scores.loc[qid, "Gain_Recall@20"] == pytest.approx(expected_recall)
            relevant = sum(g >= 1 for g in qrels[qid].values())
            graded_precisions = [sum(top10[:r]) / 3 / r for r in range(1, 11) if top10[r - 1] > 0]
            expected_map = sum(graded_precisions) / min(10, relevant) if relevant else 0.0
            assert scores.loc[qid, "MAP@10"] == pytest.approx(expected_map)
            err, reach = 0.0, 1.0
            for rank, g in enumerate(top10, start=1):
                stop = gain(g) / (gain(3) + 1)
                err += reach * stop / rank
                reach *= 1 - stop
            assert scores.loc[qid, "ERR@10"] == pytest.approx(err)
