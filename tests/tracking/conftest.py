"""A migrated, empty MLflow SQLite store, copied per test: creating the tables takes
seconds, copying the file milliseconds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # creates and migrates the tables
    return db


@pytest.fixture()
def tracking_uri(tmp_path: Path, _empty_mlflow_db: Path) -> str:
    """``sqlite:///<tmp_path>/mlruns/mlflow.db``, tables already made (artifacts go to mlruns/)."""
    (tmp_path / "mlruns").mkdir(exist_ok=True)
    shutil.copy(_empty_mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    return f"sqlite:///{tmp_path}/mlruns/mlflow.db"
