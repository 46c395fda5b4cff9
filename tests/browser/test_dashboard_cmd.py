"""`tuner dashboard` process supervision: what it starts, how it fails, how it stops.

Real processes throughout: small Python HTTP servers stand in for the UIs where the
test is about supervision (a grandchild that ignores SIGTERM, a UI that dies at
start, an owner killed by SIGKILL), and the real optuna-dashboard + MLflow server for
the end-to-end stops. Stops are judged by their outcome, no process of the UIs left,
within a deadline generous enough for a loaded machine; never by how fast they are.

This module is also the SIGKILL test's owner process: ``python test_dashboard_cmd.py owner LOG_DIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from browser_support import REPO, STUDY, DashboardProcess, alive, descendants, make_study_project

from tuner.config.experiment import free_port, load_experiment
from tuner.errors import ConfigError, TargetError
from tuner.ops.dashboard_procs import Dashboards
from tuner.ops.dashboard_specs import UiSpec, ui_specs

optuna.logging.set_verbosity(optuna.logging.WARNING)

# How long the UIs may take to be gone. Generous on purpose: a loaded CI machine is slow
# to schedule a dozen Python processes, and the outcome, not the speed, is the contract.
GONE_DEADLINE_S = 120.0


def pgid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def left_over(pids: set[int], deadline_s: float = GONE_DEADLINE_S) -> list[str]:
    """What still runs after ``deadline_s`` of the processes ``pids`` and of their process
    groups (which also catches a worker forked after ``pids`` was taken), as "pid cmdline"."""
    groups = {g for g in map(pgid, pids) if g is not None}
    end = time.monotonic() + deadline_s
    while True:
        members = {int(e) for e in os.listdir("/proc") if e.isdigit() and pgid(int(e)) in groups}
        left = sorted(p for p in pids | members if alive(p))
        if not left or time.monotonic() > end:
            return [f"{p} {cmdline(p)}" for p in left]
        time.sleep(0.2)


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:port (a bind test would trip on TIME_WAIT)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def assert_both_uis_among(pids: set[int]) -> None:
    lines = [cmdline(p) for p in pids]
    for ui in ("optuna-dashboard", "mlflow server"):
        assert any(ui in line for line in lines), f"no {ui} process among {lines}"


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Children started meanwhile inherit SIGINT ignored, as the background jobs of a
    script (and of some CI runners) do."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def http_server_spec(name: str, port: int, *, grandchild_ignoring_sigterm: bool = False) -> UiSpec:
    """A UI stand-in: serves 200 on / and, optionally, forks a child that ignores SIGTERM."""
    code = textwrap.dedent(f"""
        import http.server, signal, subprocess, sys
        if {grandchild_ignoring_sigterm!r}:
            subprocess.Popen([sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        http.server.HTTPServer(("127.0.0.1", {port}), http.server.SimpleHTTPRequestHandler).serve_forever()
    """)
    return UiSpec(name=name, argv=[sys.executable, "-c", code], host="127.0.0.1", port=port,
                  port_flag=f"--{name}-port", health_path="/")


def study_experiment(root: Path, *, tracking: bool = True) -> Path:
    return make_study_project(root, tracking={"enabled": tracking}).experiment


def create_storage(experiment: Path) -> None:
    exp = load_experiment(experiment)
    exp.state_dir.mkdir(parents=True, exist_ok=True)
    optuna.create_study(study_name=STUDY, storage=exp.storage)


def test_ui_specs_point_both_uis_at_the_experiment_stores(tmp_path: Path) -> None:
    path = study_experiment(tmp_path)
    create_storage(path)
    exp = load_experiment(path)
    optuna_spec, mlflow_spec = ui_specs(exp, optuna_port=18081, mlflow_port=15000)
    # optuna-dashboard as the tuner serves it: params under their config keys (tuner.ops.dashboard_server)
    assert optuna_spec.argv[2:] == [exp.storage, "--artifact-dir", str(exp.state_dir / "optuna-artifacts"),
                                    "--host", "127.0.0.1", "--port", "18081"]
    assert Path(optuna_spec.argv[0]).name == "tuner" and optuna_spec.argv[1] == "optuna-dashboard"
    assert optuna_spec.url == "http://127.0.0.1:18081/dashboard/"
    assert mlflow_spec.argv[1:4] == ["server", "--backend-store-uri", exp.tracking.mlflow_uri]
    assert mlflow_spec.argv[-6:] == ["--host", "127.0.0.1", "--port", "15000", "--workers", "1"]
    assert mlflow_spec.health_url == "http://127.0.0.1:15000/health"
    assert mlflow_spec.env == {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def test_no_mlflow_ui_when_tracking_is_off(tmp_path: Path) -> None:
    path = study_experiment(tmp_path, tracking=False)
    create_storage(path)
    assert [s.name for s in ui_specs(load_experiment(path))] == ["optuna-dashboard"]


def test_missing_study_storage_says_to_run_the_study_first(tmp_path: Path) -> None:
    path = study_experiment(tmp_path)
    with pytest.raises(ConfigError, match=r"no study storage at .*optuna\.db yet; run `tuner run"):
        ui_specs(load_experiment(path))


def test_stop_ends_each_process_group_including_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    specs = [http_server_spec("one", free_port(), grandchild_ignoring_sigterm=True), http_server_spec("two", free_port())]
    dash = Dashboards(specs, tmp_path / "logs", stop_timeout_s=1.0)
    dash.start()
    try:
        dash.wait_ready(deadline_s=30)
        below = set().union(*(descendants(pid) | {pid} for pid in dash.pids.values()))
        assert len(below) == 3  # two servers + the stubborn grandchild
        assert dash.failure() is None
    finally:
        dash.stop()
    assert left_over(below) == []


def test_a_ui_that_dies_at_start_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    dying = UiSpec(name="broken", argv=[sys.executable, "-c", "import sys; print('cannot open storage'); sys.exit(3)"],
                   host="127.0.0.1", port=free_port(), port_flag="--broken-port")
    with Dashboards([dying], tmp_path / "logs") as dash, pytest.raises(TargetError) as err:
        dash.wait_ready(deadline_s=30)
    assert str(err.value) == "broken exited with code 3: cannot open storage"


def test_a_taken_port_names_the_option_to_change_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(TargetError, match=f"port {port} on 127.0.0.1 is in use; pick another with --optuna-port"):
            Dashboards([http_server_spec("optuna", port)], tmp_path / "logs").start()


def test_a_stop_signal_is_noted_never_raised_and_later_ones_change_nothing() -> None:
    """`tuner dashboard`'s handler: an exception thrown into whatever runs when the signal
    lands (an import, the headline's database read) left that code half done; the command
    polls the request between its own waits instead."""
    from tuner.cli.dashboard_cmd import _stop_on_signals

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    raised: BaseException | None = None
    try:
        stop = _stop_on_signals()
        assert not stop.requested()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C / a repeated SIGTERM
            time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - what the handler must not do
            raised = exc
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert raised is None
    assert stop.requested() and stop.signum == signal.SIGTERM


def test_a_sigkilled_owner_leaves_no_ui_process(tmp_path: Path) -> None:
    """SIGKILL gives the owner no chance to stop anything: the death signal and the
    watchdog must end both groups, including a grandchild that ignores SIGTERM."""
    path = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    owner = subprocess.Popen([sys.executable, __file__, "owner", str(tmp_path / "logs")], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert owner.stdout is not None
        pids = json.loads(owner.stdout.readline() or "{}")
        assert set(pids) == {"one", "two"}, "the owner did not start its UIs"
        below = descendants(owner.pid)
        assert set(pids.values()) < below and len(below) >= 4  # + the watchdog and the grandchild
    finally:
        owner.kill()
        owner.wait()
    assert left_over(below) == []


def run_owner(log_dir: Path) -> None:
    """The owner of test_a_sigkilled_owner_leaves_no_ui_process: starts two stand-ins,
    reports their pids on stdout, then waits to be killed."""
    specs = [http_server_spec("one", free_port(), grandchild_ignoring_sigterm=True),
             http_server_spec("two", free_port())]
    dash = Dashboards(specs, log_dir, stop_timeout_s=1.0)
    dash.start()
    dash.wait_ready(deadline_s=GONE_DEADLINE_S)
    sys.stdout.write(json.dumps(dash.pids) + "\n")
    sys.stdout.flush()
    time.sleep(3600)


def real_dashboard(tmp_path: Path) -> DashboardProcess:
    path = study_experiment(tmp_path)
    create_storage(path)
    return DashboardProcess(path)


@pytest.mark.slow
def test_sigterm_stops_the_real_uis_without_orphans(tmp_path: Path) -> None:
    with real_dashboard(tmp_path) as dash:
        assert set(dash.urls) == {"optuna-dashboard", "mlflow"}
        below = dash.descendants()
        assert_both_uis_among(below)
        code = dash.signal_and_wait(signal.SIGTERM, timeout=GONE_DEADLINE_S)
    assert code == 0, "".join(dash.output)
    assert left_over(below) == []


@pytest.mark.slow
def test_ctrl_c_twice_stops_the_real_uis_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    """Python leaves an inherited SIG_IGN for SIGINT alone, so `tuner dashboard` must
    install its own handler; a second Ctrl-C while stopping must not cut the stop short."""
    dash = real_dashboard(tmp_path)
    with contextlib.ExitStack() as stack:
        with sigint_ignored():
            dash.start(deadline_s=GONE_DEADLINE_S)
        stack.callback(dash.__exit__, None, None, None)
        below = dash.descendants()
        assert_both_uis_among(below)
        assert dash.proc is not None
        dash.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        code = dash.signal_and_wait(signal.SIGINT, timeout=GONE_DEADLINE_S)
    assert code == 0, "".join(dash.output)
    assert "stopped." in "".join(dash.output)
    assert left_over(below) == []


def test_tuner_optuna_dashboard_stops_on_ctrl_c_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    # It used to keep the inherited SIG_IGN: `kill -INT` did nothing (every optuna-dashboard
    # the suite started sat out its 60 s stop deadline in a run started with SIGINT ignored).
    path = study_experiment(tmp_path)
    create_storage(path)
    port = free_port()
    with sigint_ignored():
        proc = subprocess.Popen([sys.executable, "-m", "tuner", "optuna-dashboard", load_experiment(path).storage,
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        end = time.monotonic() + GONE_DEADLINE_S
        while not listening(port):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < end, "tuner optuna-dashboard did not listen"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=GONE_DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0 and "stopped." in proc.communicate()[1]
    assert not listening(port)


@pytest.mark.slow
def test_a_sigkilled_tuner_dashboard_leaves_neither_ui(tmp_path: Path) -> None:
    with real_dashboard(tmp_path) as dash:
        below = dash.descendants()
        assert_both_uis_among(below)
        assert dash.proc is not None
        dash.proc.kill()
        dash.proc.wait()
        assert left_over(below) == []
        ports = [dash.optuna_port, dash.mlflow_port]
    assert [p for p in ports if listening(p)] == []


if __name__ == "__main__":
    if sys.argv[1:2] == ["owner"]:
        run_owner(Path(sys.argv[2]))
