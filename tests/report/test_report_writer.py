import csv
import json
import os

import matplotlib.image
import pytest

from tuner.data.dataset import Query, QuerySet
from tuner.errors import InputError
from tuner.evaluation import FailedQuery, QueryResponse, evaluate_responses
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.report import REPORT_SCHEMA, ReportContext, label_sequence, load_report, write_reports

SECTIONS = ("schema", "detail", "detail_note", "generated_at", "title", "context", "scorecard", "metric_groups", "label_distribution",
            "coverage", "groups", "oos", "failed", "queries", "unjudged", "unjudged_depth", "query_texts",
            "config_snapshot", "files")


def _result(with_confidence=True):
    qs = QuerySet("rep", "abc123", (
        Query("a", "alpha | pipes", "short", "faq", "in"),
        Query("b", "beta", "long_tail", "docs", "in"),
        Query("c", "gamma", "short", "docs", "in"),
        Query("x", "shoes", "short", "oos", "oos"),
    ))
    qrels = {"a": {"a1": 3, "a2": 1, "a3": 0}, "b": {"b1": 2}}
    conf = (lambda v: v) if with_confidence else (lambda v: None)

    def resp(qid, docs, c, handoff):
        hits = tuple(Hit(d, 10.0 - i, f"Title {d}") for i, d in enumerate(docs))
        return QueryResponse(qid, f"rid-{qid}", ParsedResponse(hits, conf(c), handoff, "0"), 12.5, 1)

    responses = [
        resp("a", ["a1", "u1", "a2"] + [f"f{i}" for i in range(22)], 0.9, False),
        resp("b", ["b1"], 0.5, False),
        resp("x", ["o1"], 0.45, True),
    ]
    return evaluate_responses(qs, qrels, responses, [FailedQuery("c", "rid-c", "HTTP 503 after 4 attempt(s)", 4)])


def test_label_sequence_format():
    assert label_sequence([3, 1, None, 0], 10) == "1:L3 | 2:L1 | 3:U | 4:L0"
    assert label_sequence([2] * 30, 2) == "1:L2 | 2:L2"
    assert label_sequence([], 10) == ""


def test_write_reports_has_every_section(tmp_path):
    result = _result()
    ctx = ReportContext(title="CI gate", labels_fingerprint="fp-1", labels_db="labels.db", url="http://svc/search",
                        queries_file="q.jsonl", spec={"top_k": 50}, extra={"trial": 7})
    paths = write_reports(result, tmp_path / "out", context=ctx, config_snapshot="fusion:\n  rrf_k: 60  # k\n")
    report = json.loads(paths.json.read_text())
    assert tuple(report) == SECTIONS and report["schema"] == REPORT_SCHEMA
    c = report["context"]
    assert (c["dataset_id"], c["dataset_hash"], c["labels_fingerprint"], c["gains"], c["trial"]) == (
        "rep", "abc123", "fp-1", "linear", 7)
    assert c["scorecard_version"] == result.scorecard_version and "Primary_Metric_Score = mean(" in c["scorecard_formula"]
    assert report["scorecard"]["Primary_Metric_Score"] == pytest.approx(result.metrics["Primary_Metric_Score"])
    assert report["label_distribution"]["labels"] == {"L0": 1, "L1": 1, "L2": 1, "L3": 1}
    # returned top 20 of in-scope queries: a -> 20 hits (L3, U, L1, 17 U), b -> L2, c failed
    assert report["label_distribution"]["returned_top20"] == {"L0": 0, "L1": 1, "L2": 1, "L3": 1, "U": 18}
    assert set(report["groups"]) == {"overall", "query_type", "source"}
    assert set(report["groups"]["query_type"]) == {"short", "long_tail"}
    assert report["groups"]["source"]["docs"]["Failed_Queries"] == 1
    assert report["groups"]["overall"]["n_queries"] == 4
    qa = next(q for q in report["queries"] if q["query_id"] == "a")
    assert qa["request_id"] == "rid-a"
    assert qa["labels_top10"] == label_sequence([3, None, 1] + [None] * 7, 10)
    assert qa["labels_top20"].count("|") == 19
    assert qa["top20"][0] == {"rank": 1, "doc_id": "a1", "label": "L3", "title": "Title a1", "score": 10.0}
    assert len(qa["top20"]) == 20
    qc = next(q for q in report["queries"] if q["query_id"] == "c")
    assert qc["status"] == "failed" and qc["top20"] == [] and qc["metrics"]["Primary_Metric_Score"] == 0.0
    assert report["failed"] == [{"query_id": "c", "request_id": "rid-c", "reason": "HTTP 503 after 4 attempt(s)",
                                 "attempts": 4, "latency_ms": None}]
    cov = report["coverage"]
    assert cov["unjudged_hits"] == len(result.unjudged) == 1 + 22
    assert any("export-unjudged" in tip for tip in cov["tips"])
    assert cov["in_scope_queries_without_labels"] == ["c"]
    assert len(report["oos"]["threshold_sweep"]) == 51  # 0.00, 0.02, ..., 1.00
    assert report["detail"] == "full" and report["detail_note"] is None
    assert report["oos"]["fallback_histogram"]["all"] == {"0": 3}
    assert report["config_snapshot"].startswith("fusion:")

    md = paths.markdown.read_text()
    for heading in ("# CI gate: rep", "## Metric context", "## Scorecard", "### Primary", "### Secondary",
                    "## Label distribution", "## Grouped views", "### By query_type", "### By source",
                    "## Out of scope and handoff", "### Confidence threshold sweep", "### Fallback level per query_type",
                    "## Coverage", "### Unjudged hits", "## Failed queries", "## Per query", "### Top-20 snapshots",
                    "## Config snapshot"):
        assert f"\n{heading}\n" in f"\n{md}", heading
    assert f"![handoff precision-recall curve]({paths.pr_curve_png.name})" in md
    assert "rid-a" in md and "1:L3 | 2:U | 3:L1" in md and "alpha \\| pipes" in md
    assert "rrf_k: 60  # k" in md

    rows = list(csv.DictReader(paths.per_query_csv.open()))
    assert [r["query_id"] for r in rows] == ["a", "b", "c", "x"]
    assert rows[0]["labels_top10"] == qa["labels_top10"] and rows[0]["request_id"] == "rid-a"

    image = matplotlib.image.imread(paths.pr_curve_png)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert report["files"] == {"markdown": "report.md", "per_query_csv": "report_per_query.csv",
                               "pr_curve_png": "report_pr_curve.png"}
    assert load_report(paths.json)["title"] == "CI gate"


def test_no_confidence_no_png_and_json_is_strict(tmp_path):
    paths = write_reports(_result(with_confidence=False), tmp_path)
    assert paths.pr_curve_png is None and not list(tmp_path.glob("*.png"))
    text = paths.json.read_text()
    assert "NaN" not in text
    report = json.loads(text)
    assert report["oos"]["threshold_sweep"] is None and report["config_snapshot"] is None
    assert "(no config snapshot recorded)" in paths.markdown.read_text()


def test_failed_write_leaves_old_report_and_no_temp_files(tmp_path):
    result = _result()
    paths = write_reports(result, tmp_path)
    before = paths.json.read_text()
    # the Markdown target becomes a directory: os.replace fails after the temp file is written
    paths.markdown.unlink()
    paths.markdown.mkdir()
    with pytest.raises(OSError):
        write_reports(result, tmp_path, config_snapshot="new")
    assert paths.json.read_text() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_load_report_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"schema": "something-else"}')
    with pytest.raises(InputError, match="not a fusion-tuner evaluation report"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{")
    with pytest.raises(InputError, match="not a readable JSON report"):
        load_report(tmp_path / "y.json")
