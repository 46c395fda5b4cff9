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
