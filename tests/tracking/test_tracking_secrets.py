"""MlflowTracker keeps secrets out of the tracking store: params and tags under secret
names, URL passwords and secret query parameters in any value, remembered secrets in
the fail reason and the config texts. Judged on the bytes of mlflow.db and mlruns/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tuner import secrets
from tuner.config.experiment import resolve_sqlite
from tuner.report.tracking import TAG_FAIL_REASON, MlflowTracker, TrialRecord, safe_value

PASSWORD = "pw-planted-4711"
KEY = "key-planted-0815-abcdef"
TOKEN = "tok-planted-4242-abcdef"


@pytest.fixture(autouse=True)
def no_remembered_secrets() -> Iterator[None]:
    secrets.forget_all()
    yield
    secrets.forget_all()


def files_holding(root: Path, planted: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and planted in p.read_bytes()]


def test_safe_value_rules() -> None:
    assert safe_value("api_key", "x") == "***"
    assert safe_value("tuner.optuna_storage", f"postgresql://u:{PASSWORD}@h/db") == "postgresql://u:***@h/db"
    assert safe_value("rerank.key_boost", 0.5, by_name=False) == "0.5"
    assert safe_value("sampler", "tpe") == "tpe"


@pytest.mark.usefixtures("tracking_uri")  # tables made (conftest)
def test_nothing_secret_reaches_the_tracking_store(tmp_path: Path) -> None:
    secrets.remember(KEY)
    uri = resolve_sqlite("sqlite:///mlruns/mlflow.db", tmp_path)
    tracker = MlflowTracker(uri, "fusion-tuner")
    parent = tracker.start_study(
        "s", params={"sampler": "tpe", "api_key": KEY, "search_space": f"http://h/x?access_token={TOKEN}"},
        tags={"tuner.optuna_storage": f"postgresql://tuner:{PASSWORD}@db:5432/x", "tuner.note": f"key {KEY}"})
    run_id = tracker.start_trial(0, {"rerank.key_boost": 0.5})
    report = tmp_path / "report.json"
    report.write_text('{"ok": true}')
    tracker.finish_trial(run_id, TrialRecord(
        number=0, state="FAIL", params={"rerank.key_boost": 0.5},
        config_texts={"config/config.yaml": f"search:\n  api_key: {KEY}\n"}, reports={"json": report},
        fail_reason=f"HTTP 401 for url 'http://h/search?access_token={TOKEN}'"))
    tracker.end_study(status="FINISHED", summary={})

    for planted in (PASSWORD, KEY, TOKEN):
        assert files_holding(tmp_path / "mlruns", planted.encode()) == [], planted
    client = MlflowClient(tracking_uri=uri)
    study_run = client.get_run(parent).data
    assert study_run.params["api_key"] == "***"
    assert study_run.params["search_space"] == "http://h/x?access_token=***"
    assert study_run.tags["tuner.optuna_storage"] == "postgresql://tuner:***@db:5432/x"
    trial_run = client.get_run(run_id).data
    assert trial_run.params["rerank.key_boost"] == "0.5"
    assert trial_run.tags[TAG_FAIL_REASON] == "HTTP 401 for url 'http://h/search?access_token=***'"
