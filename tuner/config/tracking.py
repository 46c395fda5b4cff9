"""The ``tracking:`` section: where MLflow runs go (paths resolved by load_experiment),
where the dashboards serve them (the links between Optuna trials and MLflow runs), and
how much each trial's report keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError


class TrackingConfig(StrictModel):
    enabled: bool = True
    mlflow_uri: str | None = None
    artifact_location: Path | None = None
    experiment_name: str | None = Field(default=None, description="Default: the study name.")
    optuna_dashboard_url: str = Field(
        default="http://127.0.0.1:8081/dashboard/",
        description="Where optuna-dashboard serves the study (tuner dashboard's default); the MLflow runs link here.",
    )
    mlflow_ui_url: str = Field(
        default="http://127.0.0.1:5000/",
        description="Where the MLflow UI serves the runs (tuner dashboard's default); the Optuna notes link here.",
    )
    report_detail: Literal["slim", "full"] = Field(
        default="slim",
        description="slim: per trial the scorecard, per-query metrics, config, sweep and a short summary; the "
        "baseline and each new best feasible trial keep every query's top-k snapshot (full) either way.",
    )

    @property
    def store_uri(self) -> str:
        """``mlflow_uri`` as load_experiment resolves it (default ``sqlite:///<root>/mlruns/mlflow.db``)."""
        if self.mlflow_uri is None:
            raise ConfigError("tracking.mlflow_uri is not resolved; load the experiment with load_experiment")
        return self.mlflow_uri
