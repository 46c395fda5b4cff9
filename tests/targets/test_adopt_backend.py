"""At the start of a run with ``target.reload``: the started backend is taken to serve the
config on disk only when its health answer reports that file's fingerprint; a health
answer without the field is called out loudly (no reload could ever be confirmed)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

from tuner.config.target import HealthConfig, ReloadConfig
from tuner.study.wiring import adopt_backend
from tuner.targets.reload import ConfigApplier


def runner_for(tmp_path: Path) -> tuple[SimpleNamespace, Path]:
    config = tmp_path / "config.yaml"
    config.write_text("fusion: {rrf_k: 60}\n")
    reload = ReloadConfig(signal="SIGHUP", fingerprint="status.config_fingerprint")
    applier = ConfigApplier(SimpleNamespace(), lambda: {}, reload, HealthConfig(url="http://127.0.0.1:1/health"),
                            [config])
    return SimpleNamespace(applier=applier), config


def test_a_backend_reporting_the_file_on_disk_is_adopted(tmp_path: Path) -> None:
    runner, config = runner_for(tmp_path)
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    notes: list[str] = []
    adopt_backend(runner, [config], lambda: {"status": {"config_fingerprint": f"sha256:{digest.upper()}"}},
                  note=notes.append)
    assert notes == [] and runner.applier.served == {config: config.read_text()}


def test_a_backend_serving_another_config_is_restarted_by_the_first_trial(tmp_path: Path) -> None:
    runner, config = runner_for(tmp_path)
    notes: list[str] = []
    adopt_backend(runner, [config], lambda: {"status": {"config_fingerprint": "ab" * 32}}, note=notes.append)
    assert runner.applier.served is None
    assert len(notes) == 1 and "serves another config than config.yaml" in notes[0] and "abababababab" in notes[0]


def test_a_health_answer_without_the_field_is_a_loud_warning(tmp_path: Path) -> None:
    runner, config = runner_for(tmp_path)
    notes: list[str] = []
    adopt_backend(runner, [config], lambda: {"status": "ok", "docs": 12}, note=notes.append)
    assert runner.applier.served is None
    assert len(notes) == 1 and notes[0].startswith("warning: ")
    assert "'status.config_fingerprint'" in notes[0] and "docs, status" in notes[0]
    assert "every trial will fall back to a restart" in notes[0]
