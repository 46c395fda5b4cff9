"""How the MlflowTracker's values look in MLflow: metric and param names, params per
component, secret-free values, run names, run descriptions, and where a run's local
artifacts live (so a report file can be hard-linked there instead of copied).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from tuner import secrets
from tuner.config.flatten import leaves

PARAM_VALUE_LIMIT = 6000  # MLflow's MAX_PARAM_VAL_LENGTH
TAG_VALUE_LIMIT = 8000  # MLflow's MAX_TAG_VAL_LENGTH
RUN_NAME_LIMIT = 250  # the runs.name column
_OPERATORS = {"<=": "_le_", ">=": "_ge_", "<": "_lt_", ">": "_gt_"}


def mlflow_name(name: str) -> str:
    """A metric / param name MLflow accepts: '@' (as in NDCG@10) becomes '_at_', a
    comparison (<=, >=, <, >) its letters (_le_ ...), other characters outside MLflow's
    set '_'."""
    name = name.replace("@", "_at_")
    for op, word in _OPERATORS.items():
        name = name.replace(op, word)
    return re.sub(r"[^/\w.\- :]", "_", name)


def safe_value(name: str, value: Any, *, by_name: bool = True) -> str:
    """A param or tag value as MLflow stores it: ``***`` under a secret name (tuner.secrets)
    when ``by_name``, else the text with URL passwords, secret query parameters and
    known secrets hidden. A trial's params are search-space names (``rerank.key_boost``
    is a tuned number): they go ``by_name=False``."""
    if by_name and secrets.is_secret_name(name):
        return secrets.REDACTED
    return secrets.redact_text(str(value))


def flat_params(params: Mapping[str, Any], *, by_name: bool = True) -> dict[str, str]:
    """Params as MLflow stores them, one per component so each can be plotted: the
    config keys of tuner.config.flatten (a dict value becomes ``key.sub`` params, a list
    ``key.0``, ``key.1``, recursively; an empty one stays its text). Values pass
    `safe_value`; under a secret name (``by_name``) the whole subtree is ``***``."""
    out: dict[str, str] = {}
    for path, value in leaves(params):
        keys = [".".join(path[: i + 1]) for i in range(len(path))]  # the leaf's key and its parents'
        hidden = by_name and any(secrets.is_secret_name(key) for key in keys)
        text = secrets.REDACTED if hidden else safe_value(keys[-1], value, by_name=False)
        out[mlflow_name(keys[-1])] = text[:PARAM_VALUE_LIMIT]
    return out


#: the verdict a trial's run name leads with: MLflow's runs table cuts a long name at its
#: end ("trial-1 0.4684 ..."), so the verdict goes first
FEASIBLE_MARK = "✓"
INFEASIBLE_MARK = "✗"


def trial_run_name(number: int, state: str, value: float | None, feasible: bool | None) -> str:
    """``✓ trial-15 0.4307`` (feasible), ``✗ trial-16 0.3812 infeasible``, ``trial-18 FAIL``,
    ``trial-19 PRUNED``; a COMPLETE trial without a value stays ``trial-17``. The verdict
    leads: the runs table cuts a name at its end. MLflow takes any text up to 250
    characters as a run name."""
    name = f"trial-{number}"
    if state != "COMPLETE":
        return f"{name} {state}"
    if value is None or not math.isfinite(float(value)):
        return name
    name = f"{name} {_short(float(value))}"
    if feasible is None:
        return name
    return f"{FEASIBLE_MARK} {name}" if feasible else f"{INFEASIBLE_MARK} {name} infeasible"


def _short(value: float) -> str:
    return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e5 else f"{value:.4g}"


def run_note(summary: str | None, links: Mapping[str, str]) -> str:
    """A run's description (tag mlflow.note.content, Markdown): ``summary``, then one
    ``- [label](url)`` line per link; secrets hidden, cut to MLflow's tag limit."""
    parts = [summary.strip()] if summary and summary.strip() else []
    if links:
        parts.append("\n".join(f"- [{_md_label(label)}]({_md_url(url)})" for label, url in links.items()))
    return cap_text(secrets.redact_text("\n\n".join(parts)))


def cap_text(text: str, limit: int = TAG_VALUE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _md_label(label: str) -> str:
    return re.sub(r"([\\\[\]])", r"\\\1", label)


def _md_url(url: str) -> str:
    return url.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def ui_base(url: str) -> str:
    """A UI address ending in one '/', for appending ``#/...`` routes."""
    return url.rstrip("/") + "/"


def default_artifact_root(uri: str) -> Path | None:
    """Artifacts next to a SQLite tracking database (``mlruns/`` for the default URI)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and uri[len(prefix) :].startswith("/"):
        return Path(uri[len(prefix) :]).parent
    return None


def local_artifact_dir(artifact_uri: str | None) -> Path | None:
    """The directory behind a run's artifact URI when MLflow keeps it on this machine
    (a ``file://`` URI or a bare path: MLflow's local artifact repository); None for a
    remote store (``mlflow-artifacts:``, ``s3://`` ...)."""
    if not artifact_uri:
        return None
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" and artifact_uri.startswith("/"):
        return Path(artifact_uri)
    return None


def as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def quote(value: str) -> str:
    """``value`` inside a quoted MLflow search filter."""
    return value.replace("'", "\\'")
