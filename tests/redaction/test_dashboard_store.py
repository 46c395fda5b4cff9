"""How `tuner dashboard` and the printed commands name a PostgreSQL store: with the
installed driver (a bare postgresql:// made optuna-dashboard fail with ImportError) and
with the password in the UI's environment, never on a command line or in print."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.reference_experiment import write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.ops.dashboard_specs import dashboard_commands, ui_specs, ui_store

PASSWORD = "pg-pass-planted-31337"


def test_ui_store_moves_a_postgresql_password_to_the_environment() -> None:
    assert ui_store(f"postgresql://tuner:{PASSWORD}@127.0.0.1:5432/db") == (
        "postgresql+psycopg2://tuner@127.0.0.1:5432/db", {"PGPASSWORD": PASSWORD})
    assert ui_store("postgresql+psycopg2://u:p%40ss@h/db?sslmode=require") == (
        "postgresql+psycopg2://u@h/db?sslmode=require", {"PGPASSWORD": "p@ss"})
    assert ui_store("postgresql://u@h/db") == ("postgresql+psycopg2://u@h/db", {})
    assert ui_store("sqlite:////tmp/optuna.db") == ("sqlite:////tmp/optuna.db", {})


def pg_experiment(tmp_path: Path, storage: str, *, tracking: bool = True) -> Path:
    return write_reference_experiment(tmp_path, study="dash", n_trials=1, storage=storage,
                                      tracking={"enabled": tracking})


def test_ui_specs_on_postgresql_keep_the_password_off_the_command_line(tmp_path: Path) -> None:
    exp = load_experiment(pg_experiment(tmp_path, f"postgresql://tuner:{PASSWORD}@127.0.0.1:5432/db"),
                          check_paths=False)
    optuna_spec, mlflow_spec = ui_specs(exp, optuna_port=18081, mlflow_port=15000)
    assert optuna_spec.argv[1:3] == ["optuna-dashboard", "postgresql+psycopg2://tuner@127.0.0.1:5432/db"]
    assert optuna_spec.env == {"PGPASSWORD": PASSWORD}
    assert all(PASSWORD not in " ".join(s.argv) for s in (optuna_spec, mlflow_spec))


def test_printed_commands_hold_no_password(tmp_path: Path) -> None:
    exp = load_experiment(pg_experiment(tmp_path, f"postgresql://tuner:{PASSWORD}@127.0.0.1:5432/db"),
                          check_paths=False)
    commands = dashboard_commands(exp)
    assert all(PASSWORD not in c for c in commands.values())
    assert commands["optuna"].split()[1:3] == ["optuna-dashboard", "postgresql+psycopg2://tuner@127.0.0.1:5432/db"]


def test_a_password_from_the_environment_is_printed_as_the_variable(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_TEST_PG_PASSWORD", PASSWORD)
    path = pg_experiment(tmp_path, "postgresql://tuner:${TUNER_TEST_PG_PASSWORD}@127.0.0.1:5432/db", tracking=False)
    commands = dashboard_commands(load_experiment(path, check_paths=False))
    assert commands["optuna"].startswith('PGPASSWORD="$TUNER_TEST_PG_PASSWORD" ')
    assert PASSWORD not in commands["optuna"]
