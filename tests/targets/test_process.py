"""ProcessTarget, NoneTarget and make_target with real subprocesses on loopback."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tuner.errors import ConfigError, TargetError
from tuner.experiment import HealthConfig, ProcessConfig, TargetConfig, free_port
from tuner.health import wait_healthy
from tuner.targets.factory import make_target
from tuner.targets.none import NoneTarget
from tuner.targets.process import ProcessTarget, fill_placeholders

TINY = Path(__file__).with_name("tiny_server.py")


def alive(pid: int) -> bool:
    """A live (non-zombie) process with this pid exists."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_dead(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("value: 1\n")
    return path


def tiny_target(tmp_path: Path, config: Path, **process: object) -> ProcessTarget:
    cfg = ProcessConfig(command=["{python}", str(TINY), "{config}", "{port}"], **process)  # type: ignore[arg-type]
    return ProcessTarget(cfg, config_files=[config], port=free_port(), state_dir=tmp_path / "state")


def health_url(target: ProcessTarget) -> str:
    return f"http://127.0.0.1:{target.argv[-1]}/health"


def test_start_fills_placeholders_and_restart_rereads_the_config(tmp_path: Path, config: Path) -> None:
    target = tiny_target(tmp_path, config)
    with target:
        target.start()
        first = wait_healthy(health_url(target), deadline_s=20, target=target)
        assert first["pid"] == target.pid and first["config"] == "value: 1\n"
        target.start()  # idempotent
        assert target.pid == first["pid"]
        config.write_text("value: 2\n")
        target.restart()
        second = wait_healthy(health_url(target), deadline_s=20, target=target)
        assert second["config"] == "value: 2\n" and second["pid"] == target.pid != first["pid"]
        assert wait_dead(first["pid"])
        assert target.failure() is None
    assert wait_dead(second["pid"])
    assert target.failure() == "the backend process was stopped by the tuner"
    assert "listening on" in target.log_file.read_text()
    assert target.log_file == tmp_path / "state" / "backend.log"


def test_exit_code_and_last_log_lines_are_reported(tmp_path: Path, config: Path) -> None:
    script = "import sys\nfor i in range(8): print('line', i)\nprint('bad key fusion.x', file=sys.stderr)\nsys.exit(2)"
    cfg = ProcessConfig(command=["{python}", "-c", script], log_file=tmp_path / "logs" / "b.log")
    target = ProcessTarget(cfg, config_files=[config], state_dir=tmp_path)
    assert target.failure() == "the backend process was never started"
    target.start()
    assert target._proc is not None
    target._proc.wait(timeout=20)
    reason = target.failure()
    assert reason is not None
    assert reason.startswith(f"{Path(sys.executable).name} exited with code 2: ")
    assert reason.endswith("line 4 | line 5 | line 6 | line 7 | bad key fusion.x")
    assert "\n" not in reason
    # A restart logs below the old run: the tail shows only the new run's lines.
    target.restart()
    target._proc.wait(timeout=20)
    assert (target.failure() or "").count("bad key") == 1
    target.stop()


def test_stop_kills_a_term_ignoring_group_within_the_timeout(tmp_path: Path, config: Path) -> None:
    pidfile = tmp_path / "child.pid"
    target = tiny_target(tmp_path, config, stop_timeout_s=0.5, env={"TINY_IGNORE_TERM": "1", "TINY_CHILD_PIDFILE": str(pidfile)})
    target.start()
    wait_healthy(health_url(target), deadline_s=20, target=target)
    leader = target.pid
    child = int(pidfile.read_text())
    assert leader is not None and alive(leader) and alive(child)
    started = time.monotonic()
    target.stop()
    took = time.monotonic() - started
    assert 0.5 <= took < 5.0
    assert wait_dead(leader) and wait_dead(child)
    target.stop()  # idempotent


def test_env_and_cwd_are_applied(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "out.txt"
    script = "import os, pathlib; pathlib.Path(os.environ['OUT']).write_text(os.getcwd() + ' ' + os.environ['CFG'])"
    cfg = ProcessConfig(command=["{python}", "-c", script], cwd=tmp_path, env={"OUT": str(out), "CFG": "{config}"})
    target = ProcessTarget(cfg, config_files=[config], state_dir=tmp_path)
    target.start()
    assert target._proc is not None and target._proc.wait(timeout=20) == 0
    assert out.read_text() == f"{tmp_path} {config}"


def test_placeholders_and_command_errors(tmp_path: Path, config: Path) -> None:
    assert ProcessTarget(ProcessConfig(command=["{python}"]), config_files=[config], state_dir=tmp_path).argv == [
        sys.executable
    ]
    values = {"config": "/c.yaml", "port": "81"}
    assert fill_placeholders('{"json": 1} --config {config} :{port} {unknown}', values) == (
        '{"json": 1} --config /c.yaml :81 {unknown}'
    )
    with pytest.raises(ConfigError, match=r"uses \{port\} but no port is set"):
        ProcessTarget(ProcessConfig(command=["x", "{port}"]), config_files=[config], state_dir=tmp_path)
    missing = ProcessTarget(ProcessConfig(command=[str(tmp_path / "no-such-binary")]), config_files=[config], state_dir=tmp_path)
    with pytest.raises(TargetError, match="cannot start"):
        missing.start()


def test_make_target_dispatches_on_apply(tmp_path: Path, config: Path) -> None:
    health = HealthConfig(url="http://127.0.0.1:1/health")
    process = make_target(
        TargetConfig(config_files=[config], apply="process", port=5000,
                     process=ProcessConfig(command=["srv", "{config}", "{port}"]), health=health),
        tmp_path,
    )
    assert isinstance(process, ProcessTarget) and process.argv == ["srv", str(config), "5000"]
    none = make_target(TargetConfig(config_files=[config], apply="none", health=health), tmp_path)
    assert isinstance(none, NoneTarget) and none.failure() is None
    none.start(), none.restart(), none.stop()


def test_docker_target_is_refused_clearly_while_not_installed(
    tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.experiment import DockerConfig

    monkeypatch.setitem(sys.modules, "tuner.targets.docker", None)  # as if the module did not exist
    cfg = TargetConfig(config_files=[config], apply="docker", docker=DockerConfig(service="api"),
                       health=HealthConfig(url="http://x/health"))
    with pytest.raises(ConfigError, match="docker support is not installed"):
        make_target(cfg, tmp_path)


def test_none_target_waits_for_the_reload(tmp_path: Path) -> None:
    target = NoneTarget(settle_s=0.2)
    started = time.monotonic()
    target.restart()
    assert time.monotonic() - started >= 0.2


def test_no_process_left_when_the_tuner_dies(tmp_path: Path, config: Path) -> None:
    """An interpreter that exits without stop() still takes the backend down."""
    pidfile = tmp_path / "pid"
    port = free_port()
    code = (
        "import sys, pathlib\n"
        "from tuner.experiment import ProcessConfig\n"
        "from tuner.targets.process import ProcessTarget\n"
        "from tuner.health import wait_healthy\n"
        f"t = ProcessTarget(ProcessConfig(command=['{{python}}', {str(TINY)!r}, '{{config}}', '{{port}}']),"
        f" config_files=[pathlib.Path({str(config)!r})], port={port}, state_dir=pathlib.Path({str(tmp_path)!r}))\n"
        "t.start()\n"
        f"wait_healthy('http://127.0.0.1:{port}/health', deadline_s=20, target=t)\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(t.pid))\n"
        "sys.exit(0)\n"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid = int(pidfile.read_text())
    assert wait_dead(pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    assert os.path.exists(tmp_path / "backend.log")
