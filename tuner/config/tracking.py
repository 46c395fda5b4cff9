"""The ``tracking:`` section: where MLflow runs go (paths resolved by load_experiment),
where the dashboards serve them (the links between Optuna trials and MLflow runs), and
how much each trial's report keeps, and how long a study run's tracking waits on MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError


class TrackingWaits(StrictModel):
    """How long a study run's tracking waits on MLflow (tuner.report.resilient: every call on
    one background thread behind a circuit breaker). The defaults suit a real store; shorter
    waits make a dead store cost a run less and a slow one go behind sooner."""

    run_id_s: float = Field(
        default=5.0, gt=0, description="The longest a trial waits for its MLflow run id (it goes on without it)."
    )
    stuck_s: float = Field(
        default=15.0, gt=0, description="A call that has not returned after this long puts tracking behind."
    )
    probe_every_s: float = Field(
        default=5.0, gt=0, description="Between two probes of a store that does not answer (while tracking is behind)."
    )
    drain_s: float = Field(
        default=20.0,
        ge=0,
        description="What the end of a run (a stop included) gives queued calls; then it names what MLflow misses.",
    )


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
    waits: TrackingWaits = Field(
        default_factory=TrackingWaits,
        description="How long a study run's tracking waits on MLflow (defaults: 5/15/5/20 s).",
    )

    @property
    def store_uri(self) -> str:
        """``mlflow_uri`` as load_experiment resolves it (default ``sqlite:///<root>/mlruns/mlflow.db``)."""
        if self.mlflow_uri is None:
            raise ConfigError("tracking.mlflow_uri is not resolved; load the experiment with load_experiment")
        return self.mlflow_uri
