"""The names a study records on its trials (user attributes), written by the trial runner
and read by the loop, apply, validate and the analysis tables."""

from __future__ import annotations

from collections.abc import Mapping

ATTR_METRICS = "metrics"
ATTR_ASSIGNMENT = "assignment"
ATTR_VARIANT = "variant"
ATTR_CACHE_HIT = "cache_hit"
ATTR_FAIL_REASON = "fail_reason"
ATTR_MLFLOW_RUN = "mlflow_run_id"
ATTR_REPORTS = "reports"
ATTR_PHASES = "phase_seconds"


def named_constraints(constraints: Mapping[str, float]) -> dict[str, float]:
    """Drop the positional copies ("0", "1", ...) of the legacy ``constraints`` list
    when named ones (set through ``trial.set_constraint``) exist."""
    named = {k: float(v) for k, v in constraints.items() if not k.isdigit()}
    return named or {k: float(v) for k, v in constraints.items()}

