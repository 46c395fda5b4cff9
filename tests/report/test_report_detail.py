"""Slim and full reports of a solved 300-query batch (issue 13, items 5 and 7): the slim
files are small and say where the full data is; both mark the threshold in effect."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from threshold.test_threshold import MaxFP, synthetic_batch

from tuner.errors import InputError
from tuner.evaluation.mapping import ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.regate import regate
from tuner.evaluation.result import evaluate_responses
from tuner.metrics import PRIMARY_SCORECARD
from tuner.report import ReportContext, load_report, write_reports
from tuner.report.plots import pr_curve_figure
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, solve_batch

GATES = [GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01), GateRange(MIN_SCORE_PARAM, 0.0, 0.5, 0.01)]
SLIM_COLUMNS = ["query_id", "query_type", "source", "scope", "status", "handoff", "handoff_reason", "confidence",
                "fallback_level", "n_results", "n_repeats", "Judged@10", *PRIMARY_SCORECARD, "Primary_Metric_Score",
                "labels_top10"]
SNAPSHOT = "fusion:\n  method: rrf\n  rrf_k: 60\nconfidence:\n  threshold: 0.0\n" * 20  # ~1.4 KB


@pytest.fixture(scope="module")
def solved():
    """A 300-query batch retrieved with the gates at their low end, solved and re-gated
    as a study trial does (tuner.study.trial.scoring.TrialScorer.solve)."""
    qs, qrels, responses, failed = synthetic_batch(11, n_in=250, n_oos=50, n_docs=600, depth=50)
    low = [QueryResponse(r.query_id, r.request_id, ParsedResponse(r.response.hits, r.response.confidence, False, "0"),
                         latency_ms=5.0 + i % 7, attempts=1) for i, r in enumerate(responses)]
    batch = evaluate_responses(qs, qrels, low, failed)
    sol = solve_batch(batch, GATES, constraints=[MaxFP(0.3)])
    g = GATES[0]
    gated = regate(batch, confidence_threshold=sol.by_role["confidence"], min_score=sol.by_role["min_score"],
                   sweep_range=(g.low, g.high, g.step))
    context = ReportContext(title="Study s - trial 3", url="http://svc/search", extra={
        "study": "s", "trial": 3, "solved_gates": dict(sol.values),
        "solved_gates_note": "retrieved at the low end, then solved client-side"})
    return gated, sol, context


def write(tmp_path, solved, detail):
    gated, _, context = solved
    return write_reports(gated, tmp_path / detail, context=context, config_snapshot=SNAPSHOT, detail=detail)


def test_a_slim_report_is_small_and_says_where_the_full_data_is(tmp_path, solved) -> None:
    gated, sol, _ = solved
    paths = write(tmp_path, solved, "slim")
    # no PR-curve PNG: drawing it cost more CPU than the rest of a trial's report; its data is in the JSON
    assert paths.pr_curve_png is None and not (tmp_path / "slim" / "report_pr_curve.png").exists()
    sizes = {p.name: p.stat().st_size for p in (paths.json, paths.markdown, paths.per_query_csv)}
    assert sizes["report.md"] < 12_000, sizes
    listed = len(json.dumps(json.loads(paths.json.read_text())["unjudged"]))  # top-10 unjudged: ~28 KB on the demo
    # + config (3 KB) + slim solve grid (~17 KB): <= 150 KB a trial
    assert sum(sizes.values()) - listed < 130_000, (sizes, listed)

    text = paths.json.read_text()
    assert text.count("\n") > 100  # indented, one sweep row a line
    report = json.loads(text)
    assert report["detail"] == "slim" and "best trials" in report["detail_note"] and "PR-curve" in report["detail_note"]
    assert report["files"]["pr_curve_png"] is None and len(report["oos"]["threshold_sweep"]) > 10
    assert report["queries"] is None and report["unjudged_depth"] == 10
    # the unjudged hits the label queue pools (rank <= 10), with their queries' texts; the count of all stays
    top10 = [u for u in gated.unjudged if u.rank <= 10]
    assert 0 < len(report["unjudged"]) == len(top10) < len(gated.unjudged)
    assert {u["query_id"] for u in report["unjudged"]} == set(report["query_texts"])
    assert report["coverage"]["unjudged_hits"] == len(gated.unjudged) > 0
    assert report["scorecard"]["N_Queries"] == 300
    assert report["oos"]["threshold_in_effect"] == sol.by_role["confidence"]
    assert any("lists the unjudged hits down to rank 10" in tip for tip in report["coverage"]["tips"])
    with pytest.raises(InputError, match="pass a full report"):
        load_report(paths.json, full=True)
    assert load_report(paths.json)["detail"] == "slim"

    md = paths.markdown.read_text()
    assert "pr_curve.png" not in md
    for heading in ("## Metric context", "## Solved gates", "## Scorecard", "## Out of scope and handoff",
                    "### Confidence threshold sweep", "## Coverage", "## Failed queries"):
        assert f"\n{heading}\n" in md, heading
    for heading in ("## Per query", "### Top-20 snapshots", "### Unjudged hits", "## Config snapshot"):
        assert f"\n{heading}\n" not in md, heading
    sweep_rows = [line for line in md.splitlines() if line.startswith("| ") and line.count("|") > 10][1:]
    assert len(sweep_rows) == 11  # the threshold in effect and five either side
    marked = [line for line in sweep_rows if "(in effect)" in line]
    assert marked == [sweep_rows[5]] and f"**{sol.by_role['confidence']:.4f}** (in effect)" in marked[0]

    rows = list(csv.DictReader(paths.per_query_csv.open()))
    assert list(rows[0]) == SLIM_COLUMNS and len(rows) == 300
    by_id = {r["query_id"]: r for r in rows}
    for qid, expected in gated.per_query["Primary_Metric_Score"].dropna().items():
        assert float(by_id[qid]["Primary_Metric_Score"]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_a_full_report_keeps_everything_and_marks_the_threshold_in_effect(tmp_path, solved) -> None:
    gated, sol, _ = solved
    paths = write(tmp_path, solved, "full")
    report = json.loads(paths.json.read_text())
    assert report["detail"] == "full" and report["detail_note"] is None
    assert len(report["queries"]) == 300 and len(report["unjudged"]) == len(gated.unjudged)
    assert len(report["queries"][0]["top20"]) == 20
    sweep = report["oos"]["threshold_sweep"]
    assert len(sweep) == 91 and sweep[0]["threshold"] == 0.0 and sweep[-1]["threshold"] == 0.9
    t = sol.by_role["confidence"]
    row = next(r for r in sweep if r["threshold"] == t)
    assert row["Primary_Metric_Score"] == pytest.approx(report["scorecard"]["Primary_Metric_Score"], abs=1e-12)
    md = paths.markdown.read_text()
    assert "## Per query" in md and "### Top-20 snapshots" in md and "## Config snapshot" in md
    assert md.count("(in effect)") == 1
    header = next(csv.reader(paths.per_query_csv.open()))
    assert {"request_id", "latency_ms", "labels_top20", "query"} <= set(header)
    slim = write(tmp_path, solved, "slim")
    assert paths.json.stat().st_size > 4 * slim.json.stat().st_size


@pytest.mark.parametrize("t", [0.29, 0.95])
def test_the_plot_reaches_and_marks_the_threshold_in_effect(solved, t: float) -> None:
    gated = solved[0]
    fig = pr_curve_figure(gated.threshold_sweep, threshold=t)
    right = fig.axes[1]
    low, high = right.get_xlim()
    assert low < t < high
    assert any(len(line.get_xdata()) == 2 and np.allclose(line.get_xdata(), [t, t]) for line in right.get_lines())
    assert any(f"({t:g})" in text.get_text() for text in right.get_legend().get_texts())


def test_an_unknown_detail_is_an_error(tmp_path, solved) -> None:
    with pytest.raises(ValueError, match="use one of slim, full"):
        write_reports(solved[0], tmp_path, detail="medium")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def test_a_superseded_best_rewritten_slim_keeps_the_curve_it_was_drawn_with(tmp_path, solved) -> None:
    """``pr_curve="keep"``: the slim rewrite references the PNG already there and does not
    draw it again (it is registered as an artifact, with the bytes a redraw would give)."""
    gated, _, context = solved
    full = write_reports(gated, tmp_path / "t", context=context, config_snapshot=SNAPSHOT, detail="full")
    drawn = full.pr_curve_png.read_bytes()
    kept = write_reports(gated, tmp_path / "slim", context=context, config_snapshot=SNAPSHOT, detail="slim",
                         pr_curve="keep")
    assert kept.pr_curve_png == tmp_path / "slim" / "report_pr_curve.png" and not kept.pr_curve_png.exists()
    report = json.loads(kept.json.read_text())
    assert report["detail"] == "slim" and report["files"]["pr_curve_png"] == "report_pr_curve.png"
    assert "](report_pr_curve.png)" in kept.markdown.read_text()
    assert full.pr_curve_png.read_bytes() == drawn


def test_the_short_markdown_of_a_full_report_does_not_call_it_slim(tmp_path, solved) -> None:
    """A study's baseline and best trials: full JSON, short Markdown (issue 26, item 5)."""
    gated, _, context = solved
    paths = write_reports(gated, tmp_path / "best", context=context, config_snapshot=SNAPSHOT, detail="full",
                          markdown="slim")
    assert json.loads(paths.json.read_text())["detail"] == "full"
    md = paths.markdown.read_text()
    assert "slim" not in md.lower() and "keep the full reports" not in md
    assert ("full report, summarised here: every query's top-20 snapshot and all unjudged hits are in report.json, "
            "every query's row in report_per_query.csv") in md.splitlines()[2]
    assert "## Per query" not in md and "## Coverage" in md  # still the short form
    assert "report_pr_curve.png" in md  # the full report's curve is drawn and shown
