"""The one study set-up of `tuner run` and `tuner worker` (tuner.ops.study_session): its end
puts the originals back and closes everything the session opened. The worker's own copy
of that end never closed the reload client (only `tuner run`'s did); both now end through
`StudySession.finish`."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from tuner.config.configpatch import ConfigPatcher
from tuner.config.target import HealthConfig, ReloadConfig
from tuner.errors import StudyError, TargetError
from tuner.ops import run, workers
from tuner.ops.study_session import StudySession
from tuner.report.tracker import NullTracker
from tuner.targets.reload import ConfigApplier


class Closing:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeTarget:
    """A backend that records what was done to it; ``restart_fails``: it never comes back."""

    def __init__(self, restart_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.restart_fails = restart_fails

    def start(self) -> None:
        self.calls.append("start")

    def restart(self) -> None:
        self.calls.append("restart")
        if self.restart_fails:
            raise TargetError("backend exited with code 1 on start")

    def failure(self) -> str | None:
        return None

    def close(self) -> None:
        self.calls.append("close")


class EndedTracker(NullTracker):
    def __init__(self) -> None:
        self.ended: list[str] = []

    def end_study(self, *, status: str, summary: Any) -> None:
        self.ended.append(status)


def session_for(tmp_path: Path, target: FakeTarget, *, touched: bool) -> tuple[StudySession, Any, Path]:
    config = tmp_path / "config.yaml"
    config.write_text("fusion: {rrf_k: 60}\n")
    patcher = ConfigPatcher([config], journal_path=tmp_path / "restore.journal")
    patcher.write({config: "fusion: {rrf_k: 10}\n"})  # a trial's config on disk
    # A real reload applier whose HTTP client a reload opened: nothing listens on port 1, so
    # the reload fails and the applier restarts the (fake) backend instead.
    reload = ReloadConfig.model_validate({"http": {"url": "http://127.0.0.1:1/admin/reload"}, "fingerprint": "fp"})
    applier = ConfigApplier(target, lambda: {}, reload, HealthConfig(url="http://127.0.0.1:1/health"), [config],
                            served={config: "fusion: {rrf_k: 60}\n"})
    applied = applier.apply({config: config.read_text()})
    assert applied.mode == "restart" and "reload refused" in (applied.reason or "")
    client = applier._client
    assert client is not None and not client.is_closed
    runner = SimpleNamespace(bookkeeper=Closing(), evaluator=Closing(), replay_pool=Closing(), applier=applier,
                             touched_backend=touched)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", direction="maximize")
    notes: list[str] = []
    session = StudySession(
        prepared=SimpleNamespace(patcher=patcher),  # type: ignore[arg-type]
        study=study,
        target=target,
        wait=lambda: {},
        tracker=EndedTracker(),
        runner=runner,  # type: ignore[arg-type]
        loop=SimpleNamespace(maximize=True),  # type: ignore[arg-type]
        note=notes.append,
    )
    return session, client, config


def test_the_end_of_a_session_restores_restarts_and_closes_the_reload_client(tmp_path: Path) -> None:
    target = FakeTarget()
    session, client, config = session_for(tmp_path, target, touched=True)
    target.calls.clear()
    restored = session.finish("FINISHED")
    assert restored == [config] and config.read_text() == "fusion: {rrf_k: 60}\n"
    assert target.calls == ["restart", "close"]  # back on the originals, then stopped
    assert client.is_closed  # the reload client: `tuner worker` left it open before
    runner = session.runner
    assert runner.bookkeeper.closed and runner.evaluator.closed and runner.replay_pool.closed  # type: ignore[attr-defined]
    assert session.tracker.ended == ["FINISHED"]  # type: ignore[attr-defined]


def test_a_backend_that_does_not_come_back_on_the_originals_is_one_line_and_still_everything_closes(
    tmp_path: Path,
) -> None:
    target = FakeTarget()
    session, client, config = session_for(tmp_path, target, touched=True)
    target.restart_fails = True
    with pytest.raises(StudyError, match=r"original config restored \(.*config.yaml\) but the backend did not come"):
        session.finish("FINISHED")
    assert config.read_text() == "fusion: {rrf_k: 60}\n"
    assert client.is_closed and target.calls[-1] == "close"
    assert session.tracker.ended == ["FINISHED"]  # type: ignore[attr-defined]


def test_an_untouched_backend_is_not_restarted(tmp_path: Path) -> None:
    target = FakeTarget()
    session, client, _ = session_for(tmp_path, target, touched=False)
    target.calls.clear()
    session.finish("KILLED")
    assert target.calls == ["close"] and client.is_closed


def test_run_and_worker_set_up_and_end_through_the_one_session() -> None:
    for command in (run._run_locked, workers._run_replica):
        source = inspect.getsource(command)
        assert "open_session(" in source and "session.finish(" in source, command.__qualname__
        assert "build_runner(" not in source and "StudyLoop(" not in source and ".applier" not in source
