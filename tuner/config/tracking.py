"""The ``tracking:`` section: where MLflow runs go (paths resolved by load_experiment)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from tuner.config.strict import StrictModel


class TrackingConfig(StrictModel):
    enabled: bool = True
    mlflow_uri: str | None = None
    artifact_location: Path | None = None
    experiment_name: str | None = Field(default=None, description="Default: the study name.")
