"""One copy of each report file: on a local artifact store the MLflow run holds a hard
link to the trial's file (same inode), listed and downloadable like any artifact; when
the link fails (another file system) or the store is remote, MLflow gets a copy."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tuner.files import hard_link
from tuner.report.mlflow_values import local_artifact_dir
from tuner.report.tracking import MlflowTracker, TrialRecord


@pytest.fixture()
def tracker(tracking_uri: str) -> MlflowTracker:
    t = MlflowTracker(tracking_uri, "fusion-tuner")
    t.start_study("s", params={}, tags={})
    return t


def report_set(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True)
    files = {"json": folder / "report.json", "markdown": folder / "report.md", "per_query_csv": folder / "per_query.csv"}
    files["json"].write_text('{\n  "NDCG@10": 0.43\n}\n')
    files["markdown"].write_text("# Trial 0\n\nNDCG@10 0.43\n")
    files["per_query_csv"].write_text("qid,ndcg\nq1,0.4\n")
    return files


def finish_with(tracker: MlflowTracker, reports: dict[str, Path]) -> str:
    run_id = tracker.start_trial(0, {"x": 1})
    tracker.finish_trial(run_id, TrialRecord(number=0, state="COMPLETE", params={"x": 1}, reports=reports,
                                             config_texts={"config/config.yaml": "x: 1\n"}))
    return run_id


def stored(tracker: MlflowTracker, run_id: str) -> Path:
    local = local_artifact_dir(tracker.client.get_run(run_id).info.artifact_uri)
    assert local is not None and local.is_dir()
    return local


def test_reports_are_hard_links_to_the_trial_files(tmp_path: Path, tracker: MlflowTracker) -> None:
    reports = report_set(tmp_path / "trials" / "0")
    run_id = finish_with(tracker, reports)
    local = stored(tracker, run_id)
    for path in reports.values():
        assert os.stat(local / "reports" / path.name).st_ino == os.stat(path).st_ino
        assert os.stat(path).st_nlink == 2
    assert tracker.report_files == {"linked": 3, "copied": 0}
    # The UI lists and previews them like any artifact; the config snapshot is a logged text.
    client = MlflowClient(tracker.tracking_uri)
    assert {a.path for a in client.list_artifacts(run_id, "reports")} == {
        "reports/report.json", "reports/report.md", "reports/per_query.csv"}
    assert {a.path for a in client.list_artifacts(run_id)} == {"reports", "config"}
    assert (local / "config" / "config.yaml").read_text() == "x: 1\n"
    got = client.download_artifacts(run_id, "reports/report.md", str(tmp_path / "dl"))
    assert Path(got).read_text() == reports["markdown"].read_text()


def test_a_failing_link_falls_back_to_a_copy(tmp_path: Path, tracker: MlflowTracker,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(src: object, dst: object, **kw: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    reports = report_set(tmp_path / "trials" / "0")
    run_id = finish_with(tracker, reports)
    local = stored(tracker, run_id)
    for path in reports.values():
        copy = local / "reports" / path.name
        assert copy.read_bytes() == path.read_bytes()
        assert os.stat(copy).st_ino != os.stat(path).st_ino
    assert tracker.report_files == {"linked": 0, "copied": 3}


def test_a_missing_report_file_is_skipped(tmp_path: Path, tracker: MlflowTracker) -> None:
    reports = report_set(tmp_path / "trials" / "0")
    reports["markdown"].unlink()
    run_id = finish_with(tracker, reports)
    names = {a.path for a in MlflowClient(tracker.tracking_uri).list_artifacts(run_id, "reports")}
    assert names == {"reports/report.json", "reports/per_query.csv"}


def test_only_local_artifact_stores_get_links(tmp_path: Path) -> None:
    assert local_artifact_dir("file:///srv/mlruns/1/abc/artifacts") == Path("/srv/mlruns/1/abc/artifacts")
    assert local_artifact_dir("/srv/mlruns/1/abc/artifacts") == Path("/srv/mlruns/1/abc/artifacts")
    for remote in ("mlflow-artifacts:/1/abc/artifacts", "s3://bucket/1/abc", "file://otherhost/x", None):
        assert local_artifact_dir(remote) is None


def test_a_link_replaces_an_older_file(tmp_path: Path) -> None:
    source, dest = tmp_path / "a.md", tmp_path / "run" / "reports" / "a.md"
    source.write_text("new")
    dest.parent.mkdir(parents=True)
    dest.write_text("old")
    assert hard_link(source, dest) and dest.read_text() == "new"
    assert hard_link(source, dest)  # already the same file
    assert os.stat(dest).st_ino == os.stat(source).st_ino


def test_a_config_text_is_written_into_a_local_store_and_logged_to_a_remote_one(
    tmp_path: Path, tracker: MlflowTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = finish_with(tracker, {})
    written = stored(tracker, run_id) / "config" / "config.yaml"
    assert written.read_bytes() == b"x: 1\n" and oct(written.stat().st_mode & 0o777) == "0o644"  # as log_text left it
    logged: list[tuple[str, str, str]] = []
    monkeypatch.setattr(tracker.client, "log_text", lambda run, text, name: logged.append((run, text, name)))
    import tuner.report.tracking as tracking

    monkeypatch.setattr(tracking, "local_artifact_dir", lambda uri: None)  # a remote store: MLflow writes it
    remote = finish_with(tracker, {})
    assert logged == [(remote, "x: 1\n", "config/config.yaml")]
