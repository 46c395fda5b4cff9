"""Reproduce trec_eval's own expected outputs (../shared/datasets/trec_eval_reference).

Every per-query value and the 'all' mean of every trec_eval measure we have an
equivalent for must agree to trec_eval's 4 printed decimals.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.data.qrels import GradeMap, read_qrels
from tuner.data.runs import read_run
from tuner.metrics import aggregate, prepare, score_batch

# trec_eval measure name -> our metric name (None: no equivalent, not compared).
_EQUIVALENTS: list[tuple[str, Callable[[re.Match[str]], str]]] = [
    (r"ndcg", lambda m: "NDCG"),
    (r"ndcg_cut_(\d+)", lambda m: f"NDCG@{m[1]}"),
    (r"P_(\d+)", lambda m: f"P@{m[1]}"),
    (r"recall_(\d+)", lambda m: f"Recall@{m[1]}"),
    (r"success_(\d+)", lambda m: f"Success@{m[1]}"),
    (r"recip_rank", lambda m: "MRR"),
    (r"map", lambda m: "AP"),
    (r"map_cut_(\d+)", lambda m: f"AP@{m[1]}"),
    (r"unj_(\d+)", lambda m: f"Judged@{m[1]}"),  # unj = 1 - Judged (the runs have 500 docs)
]

# Binary measures count grade >= 1 as relevant; trec_eval -l2 (relevance_level=2)
# moves that line to 2. trec_eval reads a negative grade as "unjudged" (it shows in
# unj_k), hence None.
BINARY_AT_1 = GradeMap({-1: None, 0: 0, 1: 1})
BINARY_AT_2 = GradeMap({-1: None, 0: 0, 1: 0, 2: 1, 3: 1, 4: 1})
GRADED = GradeMap({-1: None, 0: 0, 1: 1, 2: 2, 3: 3, 4: 4})
QUERIES = ["301", "302", "303"]
TOLERANCE = 0.5e-4 + 1e-9  # trec_eval prints 4 decimals


def ours(measure: str) -> str | None:
    for pattern, name in _EQUIVALENTS:
        match = re.fullmatch(pattern, measure)
        if match:
            return name(match)
    return None


def expected_values(path: Path, wanted: Callable[[str], bool]) -> dict[str, dict[str, float]]:
    """{our metric: {qid or 'all': trec_eval value}} for the measures we cover."""
    table: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        measure, qid, value = line.split()
        name = ours(measure)
        if name is None or not wanted(measure):
            continue
        number = float(value)
        table.setdefault(name, {})[qid] = 1.0 - number if measure.startswith("unj_") else number
    return table


def compare(expected: dict[str, dict[str, float]], batch) -> list[str]:
    scores = score_batch(batch, list(expected))
    means = aggregate(scores)
    wrong = []
    for metric, by_query in expected.items():
        for qid, value in by_query.items():
            got = means[metric] if qid == "all" else scores.loc[qid, metric]
            if abs(got - value) > TOLERANCE:
                wrong.append(f"{metric} {qid}: ours {got:.6f} trec_eval {value:.4f}")
    return wrong


@pytest.fixture(scope="module")
def reference(datasets_dir: Path) -> Path:
    return datasets_dir / "trec_eval_reference"


@pytest.fixture(scope="module")
def run(reference: Path):
    return read_run(reference / "results.test").rankings


def test_all_trec_measures_of_out_test_aq(reference, run):
    expected = expected_values(reference / "out.test.aq", lambda m: True)
    assert {"NDCG", "NDCG@5", "NDCG@10", "NDCG@20", "P@5", "P@10", "MRR", "AP"} <= set(expected)
    qrels = read_qrels(reference / "qrels.test", BINARY_AT_1)
    assert compare(expected, prepare(run, qrels, QUERIES, max_grade=1)) == []


def test_every_measure_of_out_test_aql_with_relevance_level_two(reference, run):
    # out.test.aql is `trec_eval -l2` on qrels.rel_level (grades -1..4): the graded
    # qrels go in as they are and relevance_level=2 does what -l2 does, for all
    # measures at once (ndcg_* included) in one batch.
    expected = expected_values(reference / "out.test.aql", lambda m: True)
    assert {"NDCG", "NDCG@10", "P@5", "P@10", "MRR", "AP", "AP@10", "Recall@100", "Success@1"} <= set(expected)
    qrels = read_qrels(reference / "qrels.rel_level", GRADED)
    batch = prepare(run, qrels, QUERIES, max_grade=4, relevance_level=2)
    assert compare(expected, batch) == []


def test_trec_eval_ndcg_ignores_the_relevance_level(reference, run):
    # Had -l2 applied to ndcg (grade 1 worth nothing), query 301's ndcg values in
    # out.test.aql would be lower: they are not, so ndcg keeps every grade's gain.
    expected = expected_values(reference / "out.test.aql", lambda m: m.startswith("ndcg"))
    below_two_dropped = GradeMap({-1: None, 0: 0, 1: 0, 2: 2, 3: 3, 4: 4})
    qrels = read_qrels(reference / "qrels.rel_level", below_two_dropped)
    wrong = compare(expected, prepare(run, qrels, QUERIES, max_grade=4, relevance_level=2))
    assert any(line.startswith("NDCG 301:") for line in wrong)


def test_binary_measures_at_level_two_equal_a_binary_grade_map(reference, run):
    # The same -l2 numbers from qrels flattened to 0/1 at grade 2 (the old way).
    expected = expected_values(reference / "out.test.aql", lambda m: not m.startswith("ndcg"))
    qrels = read_qrels(reference / "qrels.rel_level", BINARY_AT_2)
    assert compare(expected, prepare(run, qrels, QUERIES, max_grade=1)) == []


def test_parameterised_measures_of_out_test_meas_params(reference, run):
    expected = expected_values(reference / "out.test.meas_params", lambda m: True)
    assert {"NDCG@23", "P@3", "P@7", "Success@2", "Success@5", "Success@20", "Recall@2000"} <= set(expected)
    qrels = read_qrels(reference / "qrels.test", BINARY_AT_1)
    assert compare(expected, prepare(run, qrels, QUERIES, max_grade=1)) == []
