"""The run's first start serves the config files as found (tuner.ops.check.start_on_files):
a backend already up before it (a compose service's containers, which `start` leaves
running) is restarted unless its health answer proves it serves the file and no restore
journal was just replayed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.config.target import ReloadConfig
from tuner.ops.check import start_on_files


class UpTarget:
    """A target whose containers may already run before `start`."""

    def __init__(self, up: list[str]) -> None:
        self.up = up
        self.calls: list[str] = []

    def up_before_start(self) -> list[str]:
        return list(self.up)

    def start(self) -> None:
        self.calls.append("start")

    def restart(self) -> None:
        self.calls.append("restart")


def prepared(config: Path, *, replayed: str | None, fingerprint: bool) -> Any:
    reload = ReloadConfig.model_validate({"http": {"url": "http://127.0.0.1:1/admin/reload"},
                                         "fingerprint": "config_fingerprint"}) if fingerprint else None
    return SimpleNamespace(replayed=replayed,
                           experiment=SimpleNamespace(target=SimpleNamespace(reload=reload, config_files=[config])))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("fusion:\n  rrf_k: 60\n")
    return path


def served(config: Path) -> dict[str, str]:
    return {"config_fingerprint": hashlib.sha256(config.read_bytes()).hexdigest()}


def test_a_backend_up_before_the_start_is_restarted_after_a_replay(config: Path) -> None:
    target, notes = UpTarget(["proj-backend-1"]), []
    start_on_files(prepared(config, replayed="replayed ...", fingerprint=True), target, lambda: served(config),
                   note=notes.append)
    assert target.calls == ["start", "restart"]  # its fingerprint matching the restored file proves nothing new
    assert notes == ["restarting the backend (proj-backend-1 was already up) before the preflight: a restore journal "
                     "was replayed, and it may still serve a killed run's trial config"]


def test_a_backend_up_before_the_start_serving_another_config_is_restarted(config: Path) -> None:
    target, notes = UpTarget(["proj-backend-1"]), []
    start_on_files(prepared(config, replayed=None, fingerprint=True), target, lambda: {"config_fingerprint": "ab" * 32},
                   note=notes.append)
    assert target.calls == ["start", "restart"] and "nothing proves it serves" in notes[0]


def test_without_a_fingerprint_nothing_proves_what_it_serves(config: Path) -> None:
    target = UpTarget(["proj-backend-1"])
    start_on_files(prepared(config, replayed=None, fingerprint=False), target, lambda: served(config))
    assert target.calls == ["start", "restart"]


def test_a_backend_proven_to_serve_the_file_is_left_alone(config: Path) -> None:
    target = UpTarget(["proj-backend-1"])
    start_on_files(prepared(config, replayed=None, fingerprint=True), target, lambda: served(config))
    assert target.calls == ["start"]


@pytest.mark.parametrize("fresh", [False, True])
def test_a_backend_this_start_brings_up_serves_the_file(config: Path, fresh: bool) -> None:
    target = UpTarget([] if not fresh else ["replica-backend-1"])
    start_on_files(prepared(config, replayed="replayed ...", fingerprint=False), target, lambda: {}, fresh=fresh)
    assert target.calls == ["start"]
