"""DockerTarget's decisions against an in-memory engine (no Docker needed).

`FakeEngine` implements the `DockerAPI` seam with containers whose state the test
script changes; it is the only double here. The real engine is exercised by
test_docker_engine.py with the same target.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.config.target import DockerConfig
from tuner.errors import BackendExited, ConfigError, HealthTimeout, TargetError
from tuner.targets.compose import compose_project_name
from tuner.targets.docker import DockerTarget, log_tail, problem, unmounted_configs
from tuner.targets.docker_engine import (
    ContainerState,
    DockerAPI,
    DockerSDK,
    parse_docker_time,
    state_from_inspect,
)


class FakeEngine(DockerAPI):
    """Containers keyed by id; `on_restart` lets a test decide what a restart leads to."""

    def __init__(self, *containers: tuple[str, ContainerState]) -> None:
        self.by_id = {c.id: c for _, c in containers}
        self.project_of = {c.id: p for p, c in containers}
        self.calls: list[tuple[str, str]] = []
        self.log_lines: dict[str, list[str]] = {}
        self.after_restart: dict[str, list[ContainerState]] = {}  # states returned by later inspects
        self.die_codes: dict[str, list[int]] = {}
        self.log_windows: list[tuple[float | None, float | None]] = []

    def containers(self, project: str, service: str | None = None) -> list[ContainerState]:
        return [c for i, c in self.by_id.items() if self.project_of[i] == project and service in (None, c.service)]

    def projects(self) -> list[str]:
        return sorted(set(self.project_of.values()))

    def inspect(self, container_id: str) -> ContainerState | None:
        queue = self.after_restart.get(container_id)
        if queue:
            self.by_id[container_id] = queue.pop(0)
        return self.by_id.get(container_id)

    def restart(self, container_id: str, timeout_s: int) -> None:
        self.calls.append(("restart", container_id))
        self.by_id[container_id] = dataclasses.replace(self.by_id[container_id], status="running", restart_count=0)

    def start(self, container_id: str) -> None:
        self.calls.append(("start", container_id))
        self.by_id[container_id] = dataclasses.replace(self.by_id[container_id], status="running")

    def stop(self, container_id: str, timeout_s: int) -> None:
        self.calls.append(("stop", container_id))
        self.by_id[container_id] = dataclasses.replace(self.by_id[container_id], status="exited")

    def kill(self, container_id: str, signal: str) -> None:
        self.calls.append((f"kill {signal}", container_id))

    def logs(self, container_id: str, tail: int, since: float | None = None, until: float | None = None) -> str:
        self.log_windows.append((since, until))
        return "\n".join(self.log_lines.get(container_id, [])[-tail:])

    def exit_codes(self, container_id: str, since: float) -> list[int]:
        return self.die_codes.get(container_id, [])


def box(cid: str, service: str = "backend", **kw: object) -> ContainerState:
    defaults: dict[str, object] = {"status": "running", "mounts": (("/srv/cfg", "/config"),)}
    return ContainerState(id=cid, name=f"proj-{service}-{cid}", service=service, **{**defaults, **kw})  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def target(engine: FakeEngine, *, service: str = "backend", clock: Clock | None = None, **cfg: object) -> DockerTarget:
    clock = clock or Clock()
    return DockerTarget(
        DockerConfig(service=service, project="proj", **cfg),  # type: ignore[arg-type]
        config_files=[Path("/srv/cfg/config.yaml")],
        api=engine,
        clock=clock,
        sleep=clock.sleep,
    )


def test_restart_restarts_every_replica_of_the_service_only() -> None:
    engine = FakeEngine(("proj", box("a")), ("proj", box("b")), ("proj", box("m", "mlflow")), ("other", box("x")))
    target(engine).restart()
    assert engine.calls == [("restart", "a"), ("restart", "b")]


def test_restart_waits_for_the_container_healthcheck() -> None:
    engine = FakeEngine(("proj", box("a", health="healthy")))
    clock = Clock()
    starting = dataclasses.replace(engine.by_id["a"], health="starting")
    # _watch inspects once; then three polls see "starting" before "healthy".
    engine.after_restart["a"] = [starting, starting, starting, starting, dataclasses.replace(starting, health="healthy")]
    target(engine, clock=clock).restart()
    assert clock.now == pytest.approx(3 * 0.1)
    assert engine.by_id["a"].health == "healthy"


def test_restart_without_waiting_returns_at_once() -> None:
    engine = FakeEngine(("proj", box("a", health="starting")))
    clock = Clock()
    target(engine, clock=clock, wait_container_health=False).restart()
    assert clock.now == 0.0


def test_container_that_exits_during_the_health_wait_fails_fast_with_code_and_log() -> None:
    engine = FakeEngine(("proj", box("a", health="starting")))
    engine.log_lines["a"] = ["booting", "", "config error: /config/config.yaml:3: fusion.rrf_k: must be >= 0"]
    engine.after_restart["a"] = [box("a", health="starting"), box("a", status="exited", exit_code=2, health="unhealthy")]
    clock = Clock()
    with pytest.raises(BackendExited) as err:
        target(engine, clock=clock).restart()
    msg = str(err.value)
    assert "exited (exit code 2)" in msg and "fusion.rrf_k: must be >= 0" in msg and "booting" in msg
    assert clock.now == 0.0  # noticed at the first poll, not at the deadline


def test_health_deadline_names_the_container_and_its_last_check() -> None:
    engine = FakeEngine(("proj", box("a", health="starting", health_output="connection refused")))
    clock = Clock()
    with pytest.raises(HealthTimeout) as err:
        target(engine, clock=clock, health_deadline_s=2.0).restart()
    assert clock.now == pytest.approx(2.0)
    assert "proj-backend-a" in str(err.value) and "connection refused" in str(err.value)


def test_failure_reports_a_crash_loop_through_the_restart_count() -> None:
    engine = FakeEngine(("proj", box("a", started_at=100.0)))
    clock = Clock()
    t = target(engine, clock=clock, wait_container_health=False)
    t.restart()
    assert t.failure() is None
    # The policy restarted it twice: running again, exit code reset by the engine; the
    # crashed runs' codes come from its events, their output from the log in between.
    engine.log_lines["a"] = ["Traceback", "ValueError: bad weights"]
    engine.die_codes["a"] = [1, 1]
    engine.by_id["a"] = box("a", status="running", restart_count=2, exit_code=0, started_at=104.5)
    clock.now += 0.2
    reason = t.failure()
    assert reason is not None
    assert "restarting in a loop (exit code 1; 2 restarts by its restart policy)" in reason
    assert "ValueError: bad weights" in reason
    assert engine.log_windows[-1] == (100.0, 104.5)


def test_failure_polls_the_engine_at_most_every_200ms() -> None:
    engine = FakeEngine(("proj", box("a")))
    clock = Clock()
    t = target(engine, clock=clock, wait_container_health=False)
    t.restart()
    assert t.failure() is None
    engine.by_id["a"] = box("a", status="exited", exit_code=137, oom_killed=True)
    clock.now += 0.1
    assert t.failure() is None  # cached answer, no inspect yet
    clock.now += 0.1
    reason = t.failure()
    assert reason is not None and "exit code 137" in reason and "OOM" in reason


def test_unknown_service_lists_the_services_of_the_project() -> None:
    engine = FakeEngine(("proj", box("a")), ("proj", box("m", "mlflow")), ("other", box("x", "db")))
    with pytest.raises(TargetError) as err:
        target(engine, service="backnd").restart()
    assert "'backnd'" in str(err.value) and "backend, mlflow" in str(err.value) and "db" not in str(err.value)


def test_unknown_project_lists_the_projects_on_the_engine() -> None:
    engine = FakeEngine(("shop", box("a")), ("blog", box("b")))
    with pytest.raises(TargetError) as err:
        target(engine).restart()
    assert "no containers of compose project 'proj'" in str(err.value) and "blog, shop" in str(err.value)


def test_config_file_not_mounted_into_the_container_is_refused_before_any_restart() -> None:
    engine = FakeEngine(("proj", box("a", mounts=(("/elsewhere/config.yaml", "/config/config.yaml"),))))
    with pytest.raises(ConfigError) as err:
        target(engine).restart()
    assert "/srv/cfg/config.yaml is not bind-mounted into container proj-backend-a" in str(err.value)
    assert engine.calls == []


def test_start_starts_stopped_containers_and_stop_stops_only_those() -> None:
    engine = FakeEngine(("proj", box("a", status="exited")), ("proj", box("b")))
    t = target(engine)
    t.start()
    assert engine.calls == [("start", "a")]
    t.close()
    assert engine.calls == [("start", "a"), ("stop", "a")]
    assert engine.by_id["b"].status == "running"
    t.stop()  # idempotent
    assert engine.calls[-1] == ("stop", "a") and len(engine.calls) == 2


def test_up_before_start_names_the_running_containers_start_leaves_as_they_are() -> None:
    # What a running container serves is unknown (a killed run's trial config): the run
    # restarts it before its preflight (tuner.ops.check.start_on_files).
    engine = FakeEngine(("proj", box("a", status="exited")), ("proj", box("b")), ("proj", box("m", "mlflow")))
    t = target(engine)
    assert t.up_before_start() == [engine.by_id["b"].name]
    t.start()
    assert t.up_before_start() == [engine.by_id["b"].name]  # the one start started is known


def test_problem_is_none_for_running_and_starting_containers() -> None:
    assert problem(box("a")) is None
    assert problem(box("a", health="starting")) is None
    assert problem(box("a", health="healthy")) is None
    assert problem(None, name="proj-backend-1") == "container proj-backend-1 was removed"
    assert "unhealthy" in (problem(box("a", health="unhealthy", health_output="HTTP 503\nmore")) or "")


def test_log_tail_keeps_last_non_empty_lines_without_colour_codes() -> None:
    text = "one\n\n\x1b[31mtwo\x1b[0m\nthree\nfour\nfive\nsix\n"
    assert log_tail(text, lines=3) == "four | five | six"
    assert log_tail(text) == "two | three | four | five | six"


def test_unmounted_configs_accepts_file_and_directory_mounts(tmp_path: Path) -> None:
    cfg = tmp_path / "conf" / "config.yaml"
    assert unmounted_configs([cfg], [(str(tmp_path / "conf"), "/config")]) == []
    assert unmounted_configs([cfg], [(str(cfg), "/config/config.yaml")]) == []
    assert unmounted_configs([cfg], [(str(tmp_path / "con"), "/config")]) == [cfg]


def test_compose_project_name_follows_compose_rules(tmp_path: Path) -> None:
    named = tmp_path / "My Stack" / "compose.yaml"
    named.parent.mkdir()
    named.write_text("name: tuned\nservices: {}\n")
    assert compose_project_name([named], env={}) == "tuned"
    assert compose_project_name([named], env={"COMPOSE_PROJECT_NAME": "ci"}) == "ci"
    named.write_text("services: {}\n")
    assert compose_project_name([named], env={}) == "mystack"
    assert compose_project_name([], env={}) is None


def test_target_without_project_or_compose_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="target.docker.project"):
        DockerTarget(DockerConfig(service="backend"), api=FakeEngine())


def test_state_from_inspect_reads_the_engine_json() -> None:
    attrs = {
        "Id": "abc123",
        "Name": "/proj-backend-1",
        "RestartCount": 3,
        "Config": {"Labels": {"com.docker.compose.service": "backend"}},
        "State": {
            "Status": "restarting", "ExitCode": 2, "OOMKilled": False, "Error": "",
            "StartedAt": "2026-11-22T05:06:18.844578345Z",
            "Health": {"Status": "starting", "Log": [{"Output": "old"}, {"Output": "refused\n"}]},
        },
        "Mounts": [{"Source": "/srv/cfg/config.yaml", "Destination": "/config/config.yaml"}],
    }
    s = state_from_inspect(attrs)
    assert (s.name, s.service, s.status, s.exit_code, s.restart_count) == ("proj-backend-1", "backend", "restarting", 2, 3)
    assert (s.health, s.health_output) == ("starting", "refused")
    assert s.mounts == (("/srv/cfg/config.yaml", "/config/config.yaml"),)
    assert s.started_at == pytest.approx(parse_docker_time("2026-11-22T05:06:18Z") + 0.844578345)  # type: ignore[operator]
    assert parse_docker_time("0001-01-01T00:00:00Z") is None


def test_unreachable_engine_names_docker_host_and_docker_info(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The real SDK against a socket path where nothing listens.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(TargetError) as err:
        DockerSDK()
    msg = str(err.value)
    assert f"DOCKER_HOST=unix://{tmp_path}/no-engine.sock" in msg and "docker info" in msg
    assert "\n" not in msg


def test_the_docker_experiment_file_builds_a_target_for_the_compose_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.config.experiment import load_experiment
    from tuner.targets.factory import make_target

    monkeypatch.delenv("COMPOSE_PROJECT_NAME", raising=False)
    repo = Path(__file__).resolve().parents[2]
    exp = load_experiment(repo / "experiments" / "docker.yaml", check_paths=False)
    t = make_target(exp.target, exp.state_dir)  # connects to no engine until used
    assert isinstance(t, DockerTarget)
    assert (t.project, t.service) == ("fusion-tuner", "backend")
    assert t.config_files == [repo / "backend" / "config.yaml"]
