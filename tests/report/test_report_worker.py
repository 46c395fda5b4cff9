"""The PR-curve helper process of a study (tuner.report.report_worker): the same PNG as
drawing in process, no process left behind, and a dead helper costs no plot."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tuner.report.plots import pr_curve_png
from tuner.report.report_worker import ReportWorker


def sweep() -> pd.DataFrame:
    t = np.round(np.arange(0.2, 0.81, 0.05), 2)
    n = len(t)
    return pd.DataFrame({"n_handoff": np.arange(n) + 1, "Handoff_Recall": np.linspace(0, 1, n),
                         "Handoff_Precision": np.linspace(1, 0.3, n), "OOS_FP_Rate": np.linspace(0.3, 0, n),
                         "InScope_Handoff_Rate": np.linspace(0, 0.5, n), "Handoff_F1": np.linspace(0.2, 0.6, n),
                         "Primary_Metric_Score": np.linspace(0.3, 0.4, n)}, index=t)


def test_the_helper_draws_the_same_png_and_ends_with_close() -> None:
    worker = ReportWorker()
    try:
        png = worker.render(sweep(), title="Handoff: demo", threshold=0.5)
        proc = worker._proc
        assert proc is not None and proc.poll() is None  # drawn by the helper, which is still up
        assert png == pr_curve_png(sweep(), title="Handoff: demo", threshold=0.5)
        assert png.startswith(b"\x89PNG")
    finally:
        worker.close()
    assert proc.wait(timeout=30) == 0 and worker._proc is None
    # after close it draws in process (no helper started again)
    assert worker.render(sweep(), title="t", threshold=None) == pr_curve_png(sweep(), title="t", threshold=None)
    assert worker._proc is None


def test_start_runs_the_helper_before_the_first_request() -> None:
    worker = ReportWorker()
    try:
        worker.start()
        proc = worker._proc
        assert proc is not None and proc.poll() is None
        worker.start()  # idempotent: the same helper
        assert worker._proc is proc
        assert worker.render(sweep(), title="t", threshold=0.5) == pr_curve_png(sweep(), title="t", threshold=0.5)
        assert worker._proc is proc
    finally:
        worker.close()
    assert proc.wait(timeout=30) == 0


def test_a_dead_helper_falls_back_to_drawing_in_process() -> None:
    worker = ReportWorker()
    try:
        worker.render(sweep(), title="t", threshold=0.4)
        assert worker._proc is not None
        worker._proc.kill()
        worker._proc.wait(timeout=30)
        png = worker.render(sweep(), title="t", threshold=0.4)
        assert png == pr_curve_png(sweep(), title="t", threshold=0.4)
        assert worker.fallback is not None and "died" in worker.fallback
    finally:
        worker.close()


def test_a_drawing_error_is_raised_to_the_caller() -> None:
    worker = ReportWorker()
    try:
        with pytest.raises(KeyError):
            worker.render(pd.DataFrame({"x": [1.0]}), title="t", threshold=None)
        assert worker.fallback is None  # the helper is fine: the input was bad
    finally:
        worker.close()


def test_reports_written_by_the_helper_are_the_files_written_in_process_with_secrets_scrubbed(tmp_path) -> None:
    from report.test_report_writer import _result
    from tuner.report import ReportContext, write_reports
    from tuner.secrets import remember

    secret = "s3cr3t-token-value-4242"
    remember(secret)  # known in this process only: the helper must be told
    ctx = ReportContext(title="t", extra={"note": f"token was {secret}"})
    worker = ReportWorker()
    try:
        via = worker.write_reports(_result(), tmp_path / "helper", context=ctx, config_snapshot=f"key: {secret}\n")
        assert worker._proc is not None and worker.fallback is None
    finally:
        worker.close()
    write_reports(_result(), tmp_path / "local", context=ctx, config_snapshot=f"key: {secret}\n")
    files = sorted(p.name for p in (tmp_path / "helper").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "local").iterdir()) and len(files) >= 4
    assert via.json.parent == tmp_path / "helper"
    for name in files:
        data = (tmp_path / "helper" / name).read_bytes()
        assert secret.encode() not in data
        if name.endswith(".md"):  # the same but for the time it was generated
            assert _untimed(data) == _untimed((tmp_path / "local" / name).read_bytes())
        elif not name.endswith(".json"):
            assert data == (tmp_path / "local" / name).read_bytes(), name
    helper, local = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("helper", "local"))
    helper.pop("generated_at")
    local.pop("generated_at")
    assert helper == local


def _untimed(markdown: bytes) -> list[bytes]:
    return [line for line in markdown.splitlines() if not line.startswith(b"Generated ")]


@pytest.mark.parametrize("detail", ["full", "slim"])
def test_reports_from_the_copy_sent_to_the_helper_are_the_same_bytes(tmp_path, monkeypatch, detail: str) -> None:
    """for_reports cuts each response's hits to REPORT_HIT_DEPTH: every report file must
    come out byte for byte as from the whole batch (50 hits per response here)."""
    import datetime

    from threshold.test_threshold import synthetic_batch

    from tuner.evaluation.result import evaluate_responses
    from tuner.report import build
    from tuner.report.build import REPORT_HIT_DEPTH, for_reports
    from tuner.report.context import ReportContext
    from tuner.report.writer import write_reports

    qs, qrels, responses, failed = synthetic_batch(5, n_docs=120, depth=50)
    result = evaluate_responses(qs, qrels, responses, failed)
    copy = for_reports(result)
    assert max(len(h) for h in result.hits.values()) == 50
    assert max(len(h) for h in copy.hits.values()) == REPORT_HIT_DEPTH < 50
    ctx = ReportContext(title="t")

    class FixedClock(datetime.datetime):  # the reports' "generated at" second must not tick between the two
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(build, "datetime", FixedClock)
    whole = write_reports(result, tmp_path / "whole", context=ctx, config_snapshot="a: 1\n", detail=detail)
    cut = write_reports(copy, tmp_path / "cut", context=ctx, config_snapshot="a: 1\n", detail=detail)
    assert (whole.pr_curve_png is None) == (cut.pr_curve_png is None) == (detail == "slim")  # full reports only
    for name in ("json", "markdown", "per_query_csv", *(["pr_curve_png"] if detail == "full" else [])):
        a, b = getattr(whole, name), getattr(cut, name)
        assert a is not None and a.read_bytes() == b.read_bytes(), name
    assert len(result.hits) == len(copy.hits) and result.metrics == copy.metrics


def _fresh_png(frame: pd.DataFrame, title: str, threshold: float | None) -> bytes:
    import io

    from PIL import Image

    from tuner.report import plots

    fig = plots.pr_curve_figure(frame, title=title, threshold=threshold)  # a figure of its own
    fig.canvas.draw()
    image = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).quantize(
        colors=plots.PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE)
    buf = io.BytesIO()
    image.save(buf, format="PNG", dpi=(plots.DPI, plots.DPI))
    return buf.getvalue()


def test_the_reused_figure_draws_each_plot_as_a_fresh_figure_would() -> None:
    """pr_curve_png keeps one figure between calls: whatever came before (more curves,
    another range, a marked threshold, a legend), the next plot's bytes are a fresh figure's."""
    base = sweep()
    wide = base.set_index(np.round(np.linspace(0.0, 0.9, len(base)), 2))
    fewer = base.drop(columns=["Handoff_F1", "Primary_Metric_Score"])
    cases = [(base, "a", 0.5), (wide, "b", None), (fewer, "c", 0.35), (base, "d", 2.0), (wide, "e", 0.9),
             (base, "a", 0.5)]
    for frame, title, threshold in cases:
        assert pr_curve_png(frame, title=title, threshold=threshold) == _fresh_png(frame, title, threshold), title


def test_labels_and_queries_are_sent_once_and_sent_again_when_they_change(tmp_path, monkeypatch) -> None:
    """The helper keeps a batch's labels and queries (the same every trial): a later call
    sends them only when they differ, and each call's files are the in-process ones."""
    import dataclasses

    from report.test_report_writer import _result
    from tuner.report import report_worker
    from tuner.report.writer import write_reports

    sent: list[dict] = []
    real_send = report_worker._send

    def spy(stream, value):
        if len(value) == 5 and value[0] == "write_reports":
            sent.append(value[4])
        real_send(stream, value)

    monkeypatch.setattr(report_worker, "_send", spy)
    first = _result()
    relabelled = dataclasses.replace(first, qrels={**first.qrels, "b": {"b1": 0}})  # a label edited mid-study
    worker = ReportWorker()
    try:
        for i, result in enumerate([first, _result(), relabelled, relabelled]):
            worker.write_reports(result, tmp_path / f"helper{i}", detail="slim")
            write_reports(result, tmp_path / f"local{i}", detail="slim")
            helper, local = (json.loads((tmp_path / f"{d}{i}" / "report.json").read_text()) for d in ("helper", "local"))
            helper.pop("generated_at"), local.pop("generated_at")
            assert helper == local, i
        assert worker.fallback is None
    finally:
        worker.close()
    held = [{k for k, v in s.items() if v == report_worker._HELD} for s in sent]
    assert held == [set(), {"qrels", "queries"}, {"queries"}, {"qrels", "queries"}]
    assert json.loads((tmp_path / "helper2" / "report.json").read_text())["label_distribution"] != json.loads(
        (tmp_path / "helper1" / "report.json").read_text()
    )["label_distribution"]  # the edited label reached the helper
