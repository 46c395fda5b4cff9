"""A report of answers that listed a document twice says what the metrics scored: its
label sequences are the ranks of the list without the repeats (the first occurrence
counts), and the count of removed repeats is in the JSON, the Markdown and the CSV."""

from __future__ import annotations

import csv

import pytest

from tuner.data.dataset import Query, QuerySet
from tuner.evaluation.mapping import parse_response
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import evaluate_responses
from tuner.evaluation.spec import ResponseMapping
from tuner.report import write_reports
from tuner.report.build import build_report
from tuner.report.markdown import render_markdown

ANSWERS = {
    "q1": ["r1", "r1", "r1", "r2", "u1"],
    "q2": ["u1", "r3", "u2", "r3", "r4", "u1", "r5", "r5", "r5", "r5", "r5", "r6"],
    "q3": ["r6", "x", "y"],
}
QRELS = {"q1": {"r1": 3, "r2": 3, "u1": 0}, "q2": {"r3": 2, "r4": 1, "r5": 3, "r6": 2}, "q3": {"r6": 1, "y": 3}}


@pytest.fixture(scope="module")
def result():
    queries = QuerySet("dupes", "h", tuple(Query(q, f"text {q}", "short", "t", "in") for q in ANSWERS))
    responses = [
        QueryResponse(q, f"r-{q}", parse_response({"results": [{"doc_id": d, "score": 1.0 - i / 100}
                                                               for i, d in enumerate(docs)]},
                                                  ResponseMapping(), q, top_k=50), 5.0)
        for q, docs in ANSWERS.items()
    ]
    return evaluate_responses(queries, QRELS, responses)


def _grades(sequence: str) -> list[int]:
    """``1:L3 | 2:U`` -> [3, 0] (an unjudged hit counts as Irrelevant)."""
    return [0 if tok.split(":")[1] == "U" else int(tok.split(":")[1][1:]) for tok in sequence.split(" | ") if tok]


def test_labels_top10_are_the_ranks_the_metrics_scored(result):
    report = build_report(result)
    for entry in report["queries"]:
        qid, metrics = entry["query_id"], entry["metrics"]
        grades = _grades(entry["labels_top10"])
        assert grades == [QRELS[qid].get(d, 0) for d in dict.fromkeys(ANSWERS[qid])][:10], qid
        assert metrics["Avg_Grade@10"] == pytest.approx(sum(grades) / 10), qid
        assert metrics["Strong_Precision@10"] == pytest.approx(sum(g >= 2 for g in grades) / 10), qid
        assert metrics["P@1"] == (1.0 if grades and grades[0] >= 1 else 0.0), qid
        assert [h["doc_id"] for h in entry["top20"]] == list(dict.fromkeys(ANSWERS[qid])), qid
    assert report["queries"][0]["labels_top10"] == "1:L3 | 2:L3 | 3:L0"  # r2 at rank 2, not at 4
    assert {e["query_id"]: e["n_repeats"] for e in report["queries"]} == {"q1": 2, "q2": 6, "q3": 0}
    assert report["scorecard"]["N_Repeated_Hits"] == 8
    assert "N_Repeated_Hits" in report["metric_groups"]["operations"]


def test_the_markdown_and_the_csv_count_the_removed_repeats(result, tmp_path):
    text = render_markdown(build_report(result))
    assert "| N_Repeated_Hits | 8 |" in text
    assert "N_Repeated_Hits = 8: answers listed a doc id again after its first place" in text
    assert "confidence n/a, repeats removed 2\n" in text and "confidence n/a, repeats removed 6\n" in text
    for detail in ("full", "slim"):
        paths = write_reports(result, tmp_path / detail, detail=detail)
        with open(paths.per_query_csv, newline="") as fh:
            rows = {r["query_id"]: r for r in csv.DictReader(fh)}
        assert {q: r["n_repeats"] for q, r in rows.items()} == {"q1": "2", "q2": "6", "q3": "0"}, detail
        assert rows["q1"]["labels_top10"] == "1:L3 | 2:L3 | 3:L0", detail
