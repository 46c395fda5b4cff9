"""`tuner dashboard` process supervision: what it starts, how it fails, how it stops.

Real processes throughout: small Python HTTP servers stand in for the UIs where the
test is about supervision (a grandchild that ignores SIGTERM, a UI that dies at
start), and the real optuna-dashboard + MLflow server for the SIGTERM end-to-end.
"""

from __future__ import annotations

import signal
import socket
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from browser_support import STUDY, DashboardProcess, all_gone, descendants, make_study_project

from tuner.dashboard import Dashboards, UiSpec, ui_specs
from tuner.errors import ConfigError, TargetError
from tuner.experiment import free_port, load_experiment

optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    assert optuna_spec.argv[1:] == [exp.storage, "--artifact-dir", str(exp.state_dir / "optuna-artifacts"),
                                    "--host", "127.0.0.1", "--port", "18081"]
    assert Path(optuna_spec.argv[0]).name == "optuna-dashboard"
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
    assert all_gone(below) == []


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


@pytest.mark.slow
def test_sigterm_stops_the_real_uis_without_orphans(tmp_path: Path) -> None:
    path = study_experiment(tmp_path)
    create_storage(path)
    with DashboardProcess(path) as dash:
        assert set(dash.urls) == {"optuna-dashboard", "mlflow"}
        below = dash.descendants()
        assert len(below) >= 2
        code = dash.signal_and_wait(signal.SIGTERM)
    assert code == 0, "".join(dash.output)
    assert all_gone(below) == []
