"""ProcessTarget, NoneTarget and make_target with real subprocesses on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest

from tuner.config.experiment import free_port
from tuner.config.target import HealthConfig, ProcessConfig, TargetConfig
from tuner.errors import ConfigError, TargetError
from tuner.targets.factory import make_target
from tuner.targets.health import wait_healthy
from tuner.targets.leftovers import BackendRecord, _boot_id, reap_leftover, record_path, start_time
from tuner.targets.none import NoneTarget
from tuner.targets.process import ProcessTarget, _die_with_parent, fill_placeholders

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
    assert 0.5 <= took < 30.0  # the 0.5 s timeout, then SIGKILL (generous: a busy machine)
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
    from tuner.config.target import DockerConfig

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
        "from tuner.config.target import ProcessConfig\n"
        "from tuner.targets.process import ProcessTarget\n"
        "from tuner.targets.health import wait_healthy\n"
        f"t = ProcessTarget(ProcessConfig(command=['{{python}}', {str(TINY)!r}, '{{config}}', '{{port}}']),"
        f" config_files=[pathlib.Path({str(config)!r})], port={port}, state_dir=pathlib.Path({str(tmp_path)!r}))\n"
        "t.start()\n"
        f"wait_healthy('http://127.0.0.1:{port}/health', deadline_s=20, target=t)\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(t.pid))\n"
        "sys.exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid = int(pidfile.read_text())
    assert wait_dead(pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    assert os.path.exists(tmp_path / "backend.log")


# --- A backend never outlives the run that started it (tuner.targets.leftovers) ---------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc are Linux's")

# A tuner in a subprocess: starts the tiny server (optionally with a forked grandchild),
# writes the backend's pid when healthy, then waits to be killed.
_TUNER = """
import pathlib, sys, time
from tuner.config.target import ProcessConfig
from tuner.targets.health import wait_healthy
from tuner.targets.process import ProcessTarget
config, state_dir, port, pidfile, child_pidfile = sys.argv[1:]
env = {{"TINY_CHILD_PIDFILE": child_pidfile}} if child_pidfile else {{}}
t = ProcessTarget(ProcessConfig(command=["{{python}}", {tiny!r}, "{{config}}", "{{port}}"], env=env),
                  config_files=[pathlib.Path(config)], port=int(port), state_dir=pathlib.Path(state_dir))
t.start()
wait_healthy(f"http://127.0.0.1:{{port}}/health", deadline_s=30, target=t)
if child_pidfile:
    while not pathlib.Path(child_pidfile).exists():
        time.sleep(0.02)
pathlib.Path(pidfile).write_text(str(t.pid))
time.sleep(600)
"""


def start_and_sigkill_a_tuner(tmp_path: Path, config: Path, *, grandchild: bool = False) -> tuple[int, int | None]:
    """Run a tuner until its backend is healthy, SIGKILL it; (backend pid, grandchild pid)."""
    pidfile, child_pidfile = tmp_path / "backend.pid.seen", tmp_path / "child.pid"
    args = [str(config), str(tmp_path / "state"), str(free_port()), str(pidfile), str(child_pidfile) if grandchild else ""]
    tuner = subprocess.Popen([sys.executable, "-c", _TUNER.format(tiny=str(TINY)), *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists():
            assert tuner.poll() is None, tuner.stderr.read() if tuner.stderr else ""
            assert time.monotonic() < deadline, "the backend never got healthy"
            time.sleep(0.05)
        backend = int(pidfile.read_text())
        child = int(child_pidfile.read_text()) if grandchild else None
        assert alive(backend) and (child is None or alive(child))
    finally:
        tuner.send_signal(signal.SIGKILL)
        tuner.wait(timeout=30)
    return backend, child


def independent_process() -> subprocess.Popen[bytes]:
    """A sleeping process in a session of its own, started by nobody's target."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)


def write_record_by_hand(state_dir: Path, pid: int, *, start_time: int | None, owner_pid: int,
                         owner_start_time: int | None, token: str = "not-carried") -> None:
    record = BackendRecord(pid=pid, pgid=pid, start_time=start_time, argv=["sleeper", "--flag"], owner_pid=owner_pid,
                           owner_start_time=owner_start_time, host=socket.gethostname(), boot_id=_boot_id(),
                           token=token)
    state_dir.mkdir(parents=True, exist_ok=True)
    record_path(state_dir).write_text(json.dumps(asdict(record)))


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    return gone.pid


@linux_only
def test_start_records_the_backend_and_a_stop_forgets_it(tmp_path: Path, config: Path) -> None:
    target = tiny_target(tmp_path, config)
    record_file = tmp_path / "state" / "backend.pid"
    target.start()
    try:
        record = json.loads(record_file.read_text())
        assert record["pid"] == record["pgid"] == target.pid
        assert record["start_time"] == start_time(target.pid) is not None
        assert record["argv"] == target.argv
        assert record["owner_pid"] == os.getpid() and record["host"] == socket.gethostname()
        environ = Path(f"/proc/{target.pid}/environ").read_bytes().split(b"\0")
        assert f"TUNER_BACKEND_ID={record['token']}".encode() in environ
    finally:
        target.stop()
    assert not record_file.exists()
    assert target.reaped == []


@linux_only
def test_a_sigkilled_tuner_takes_its_backend_along(tmp_path: Path, config: Path) -> None:
    backend, _ = start_and_sigkill_a_tuner(tmp_path, config)
    assert wait_dead(backend, timeout_s=30)


@linux_only
def test_the_next_start_ends_what_a_killed_run_left(tmp_path: Path, config: Path) -> None:
    """The parent-death signal ends the backend, not the child it forked: the record does."""
    backend, child = start_and_sigkill_a_tuner(tmp_path, config, grandchild=True)
    assert child is not None and wait_dead(backend, timeout_s=30)
    time.sleep(0.5)
    assert alive(child), "the grandchild was meant to outlive the parent-death signal"

    target = tiny_target(tmp_path, config)
    with target:
        target.start()
        assert wait_dead(child, timeout_s=30)
        assert len(target.reaped) == 1
        assert f"ended processes {child} of backend pid {backend} (" in target.reaped[0]
        assert "left by a killed run (pid " in target.reaped[0] and str(TINY) in target.reaped[0]
        wait_healthy(health_url(target), deadline_s=20, target=target)
        assert alive(target.pid)  # its own backend was not taken for a leftover
    assert not (tmp_path / "state" / "backend.pid").exists()


@linux_only
def test_a_leftover_whose_pid_checks_out_is_ended_with_its_group(tmp_path: Path) -> None:
    state = tmp_path / "state"
    orphan = independent_process()
    try:
        write_record_by_hand(state, orphan.pid, start_time=start_time(orphan.pid), owner_pid=dead_pid(),
                             owner_start_time=None)
        message = reap_leftover(state, timeout_s=5)
        assert message is not None and message.startswith(f"ended backend pid {orphan.pid} (sleeper --flag)")
        assert wait_dead(orphan.pid, timeout_s=30)
        assert not (state / "backend.pid").exists()
    finally:
        orphan.kill()
        orphan.wait()


@linux_only
def test_an_owner_pid_that_was_recycled_counts_as_dead(tmp_path: Path) -> None:
    state = tmp_path / "state"
    orphan = independent_process()
    try:
        # This process holds the owner's pid, but started at another time.
        write_record_by_hand(state, orphan.pid, start_time=start_time(orphan.pid), owner_pid=os.getpid(),
                             owner_start_time=(start_time(os.getpid()) or 0) + 1)
        assert reap_leftover(state, timeout_s=5) is not None
        assert wait_dead(orphan.pid, timeout_s=30)
    finally:
        orphan.kill()
        orphan.wait()


@linux_only
def test_a_recycled_pid_is_never_touched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    stranger = independent_process()
    try:
        started = start_time(stranger.pid)
        assert started is not None
        write_record_by_hand(state, stranger.pid, start_time=started - 1, owner_pid=dead_pid(), owner_start_time=None)
        assert reap_leftover(state, timeout_s=5) is None
        time.sleep(0.5)
        assert alive(stranger.pid)
        assert not (state / "backend.pid").exists()  # the record is stale: forgotten
    finally:
        stranger.kill()
        stranger.wait()


@linux_only
def test_a_live_runs_backend_is_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    backend = independent_process()
    try:
        write_record_by_hand(state, backend.pid, start_time=start_time(backend.pid), owner_pid=os.getpid(),
                             owner_start_time=start_time(os.getpid()))
        assert reap_leftover(state, timeout_s=5) is None
        time.sleep(0.5)
        assert alive(backend.pid) and (state / "backend.pid").exists()
        # A bare pid (what another writer may keep under the same name) is not a record.
        (state / "backend.pid").write_text(str(backend.pid))
        assert reap_leftover(state, timeout_s=5) is None
        assert alive(backend.pid) and (state / "backend.pid").read_text() == str(backend.pid)
    finally:
        backend.kill()
        backend.wait()


def test_the_parent_death_signal_is_armed_on_the_main_thread_only() -> None:
    assert (_die_with_parent() is not None) == sys.platform.startswith("linux")
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(_die_with_parent()))
    thread.start()
    thread.join()
    assert seen == [None]
