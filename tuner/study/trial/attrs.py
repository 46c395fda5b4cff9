"""The names a study records on its trials, written by the trial runner and read by
the loop, apply, validate and the analysis tables.

Two kinds, so optuna-dashboard's trial table stays readable:

- user attributes (shown as table columns): a few scalars a person sorts and filters
  by -- variant, feasible, the constraint metrics, judged@10, cache hit, fail reason;
- records (the JSON blobs: metrics, assignment, report paths, phase timings, data
  fingerprint, cache note): trial *system* attributes named ``tuner.<name>``, which the
  dashboard does not show. Read them with `trial_attr` / `metrics_of` / `assignment_of`
  / `reports_of`; studies written before the split kept them as user attributes, and
  the readers fall back to those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.optuna_adapter import set_trial_system_attr

# user attributes (scalars)
ATTR_VARIANT = "variant"
ATTR_FEASIBLE = "feasible"
ATTR_CACHE_HIT = "cache_hit"
ATTR_CACHED_FROM = "cached_from_trial"
ATTR_FAIL_REASON = "fail_reason"
ATTR_EARLY_STOP = "early_stop"  # why the batch stopped before its last query (a COMPLETE, infeasible trial)
ATTR_MLFLOW_RUN = "mlflow_run_id"
ATTR_APPLIED = "applied"  # how the backend took the config: reload, restart, or "restart: <why not a reload>"
ATTR_REPLAY_SETTINGS = "replay_settings"  # fusion replay: how many settings a replay trial scored
ATTR_JUDGED = "judged@10"
ATTR_FAILED_QUERIES = "failed_queries"
ATTR_DURATION = (
    "duration_s"  # the trial's duration (tuner.study.trial.outcome.trial_seconds), as printed and in trials.csv
)

# records (system attributes under RECORD_PREFIX)
ATTR_METRICS = "metrics"
ATTR_ASSIGNMENT = "assignment"
ATTR_REPORTS = "reports"
ATTR_PHASES = "phase_seconds"
ATTR_CACHE_NOTE = "cache_note"  # why a trial missed the cache, or why its result was not stored
ATTR_DATA_FINGERPRINT = "data_fingerprint"  # {"inputs": digest, "backend": fingerprint} it was measured on
# which constraint moved a solved gate off its value as found, and how far: a sentence, so a
# record (in the dashboard's table it widened a trial's page past the window); the trial note shows it
ATTR_GATES_MOVED = "gates_moved"
# fusion replay: how it chose, settings scored, replayed vs live of those verified (a nested
# record: as a user attribute it made a replay trial's row 600 px tall and its page 6,678 px wide)
ATTR_REPLAY = "replay"
RECORD_PREFIX = "tuner."
RECORDS = frozenset(
    {
        ATTR_METRICS,
        ATTR_ASSIGNMENT,
        ATTR_REPORTS,
        ATTR_PHASES,
        ATTR_CACHE_NOTE,
        ATTR_DATA_FINGERPRINT,
        ATTR_GATES_MOVED,
        ATTR_REPLAY,
    }
)


def record_key(name: str) -> str:
    """The system attribute holding record ``name``."""
    return RECORD_PREFIX + name


def set_record(trial: Any, name: str, value: Any) -> None:
    """Store record ``name`` on a running ``optuna.Trial`` (a system attribute)."""
    set_trial_system_attr(trial, record_key(name), value)


def trial_attr(trial: Any, name: str, default: Any = None) -> Any:
    """Record or user attribute ``name`` of a (frozen) trial: the record first, then
    the user attribute of the same name (studies written before records existed)."""
    system = getattr(trial, "system_attrs", None) or {}
    key = record_key(name)
    if key in system:
        return system[key]
    return (getattr(trial, "user_attrs", None) or {}).get(name, default)


def metrics_of(trial: Any) -> dict[str, Any]:
    return dict(trial_attr(trial, ATTR_METRICS) or {})


def assignment_of(trial: Any) -> dict[str, Any]:
    return dict(trial_attr(trial, ATTR_ASSIGNMENT) or {})


def reports_of(trial: Any) -> dict[str, str]:
    return dict(trial_attr(trial, ATTR_REPORTS) or {})


def named_constraints(constraints: Mapping[str, float]) -> dict[str, float]:
    """Drop the positional copies ("0", "1", ...) of the legacy ``constraints`` list
    when named ones (set through ``trial.set_constraint``) exist."""
    named = {k: float(v) for k, v in constraints.items() if not k.isdigit()}
    return named or {k: float(v) for k, v in constraints.items()}
