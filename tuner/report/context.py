"""What a report says about how its numbers were made, beyond the batch itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Version of the report layout (JSON keys); bump on a breaking change.
REPORT_SCHEMA = "fusion-tuner.eval-report/1"


@dataclass(frozen=True)
class ReportContext:
    """Provenance recorded in every report. Dataset id/hash, gain scheme and scorecard
    version come from the BatchResult itself; this adds what only the caller knows."""

    title: str = "Batch evaluation"
    labels_fingerprint: str | None = None
    labels_db: str | None = None
    url: str | None = None
    queries_file: str | None = None
    #: the EvalSpec as a plain dict (spec.model_dump()), when there is one
    spec: Mapping[str, Any] | None = None
    #: anything else worth keeping next to the numbers (experiment, trial number, git sha)
    extra: Mapping[str, Any] = field(default_factory=dict)
