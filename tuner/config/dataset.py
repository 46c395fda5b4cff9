"""The ``dataset:`` section: the query file, the labels database and the label files to import."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError


class LabelSource(StrictModel):
    path: Path
    format: Literal["qrels", "jsonl", "csv"] = "qrels"
    grade_map: dict[str, int] | None = Field(
        default=None, description="Raw grade -> 0..3 (e.g. Cranfield codes); keys compared as strings."
    )

    @field_validator("grade_map", mode="before")
    @classmethod
    def _keys_as_str(cls, v: Any) -> Any:
        return {str(k): g for k, g in v.items()} if isinstance(v, Mapping) else v

    @field_validator("grade_map")
    @classmethod
    def _grades(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        for raw, grade in (v or {}).items():
            if not 0 <= grade <= 3:
                raise ValueError(f"grade_map {raw}: {grade} is not a grade 0..3 (map to 0..3)")
        return v


class DatasetConfig(StrictModel):
    queries: Path
    dataset_id: str | None = Field(
        default=None, description="Default: derived from the query file by tuner.data.dataset."
    )
    labels_db: Path | None = None
    labels: list[LabelSource] = Field(
        default_factory=list,
        description="Imported when labels_db has no labels for the "
        "dataset; a file changed since its import "
        "stops the commands.",
    )
    unjudged_queries: Literal["drop", "keep", "error"] = Field(
        default="drop",
        description="In-scope queries with no judgment at all: drop them (counted and said), keep them (each "
        "scores 0 whatever the config) or stop with an error.",
    )

    @property
    def labels_path(self) -> Path:
        """``labels_db`` as load_experiment resolves it (default ``<state_dir>/labels.db``)."""
        if self.labels_db is None:
            raise ConfigError("dataset.labels_db is not resolved; load the experiment with load_experiment")
        return self.labels_db
