"""The experiment file of "the reference backend as a process on the demo data".

Several suites (e2e, holdout, workers, browser) run real studies against
``fusion_backend serve`` started by the process target. They share one experiment
shape and differ in a few values, so the shape lives here once as a dict and each
test states only what differs::

    config = copy_backend_config(root)                  # root/backend/config.yaml
    path = write_reference_experiment(root, study="s", n_trials=3,
                                      storage="sqlite:///...", evaluation={"top_k": 50})

Overrides are deep-merged: a dict merges key by key, anything else (lists included)
replaces the value, and ``DROP`` removes a key.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
FUSION_SPACE = REPO / "search_space" / "reference_fusion.yaml"
FULL_SPACE = REPO / "search_space" / "reference_full.yaml"
SHORTLIST = REPO / "experiments" / "shortlist_reference.yaml"
BACKEND_CONFIG = REPO / "backend" / "config.yaml"


class _Drop:
    def __repr__(self) -> str:
        return "DROP"

    def __deepcopy__(self, memo: dict[int, Any]) -> "_Drop":
        return self  # identity is what marks it


DROP: Any = _Drop()
"""An override value that removes the key from the experiment."""

# {python}, {config}, {port}, {query}, {top_k} are the tuner's own placeholders, filled
# in per trial / per query: they stay literal here.
_BASE: dict[str, Any] = {
    "state_dir": "state",
    "dataset": {
        "queries": "data/queries.jsonl",
        "dataset_id": "demo",
        "labels": [{"path": "data/qrels.txt", "format": "qrels"}],
    },
    "target": {
        "config_files": ["backend/config.yaml"],
        "apply": "process",
        "port": "auto",
        "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config", "{config}",
                                "--port", "{port}"]},
        "health": {"url": "http://127.0.0.1:{port}/health", "deadline_s": 90, "interval_s": 0.1},
    },
    "evaluation": {
        "request": {"url": "http://127.0.0.1:{port}/search", "body": {"query": "{query}", "top_k": "{top_k}"}},
        "response": {"confidence": "confidence", "handoff": "handoff", "fallback_level": "fallback_level"},
        "top_k": 20,
    },
    "search_space": str(FUSION_SPACE),
    "tracking": {"enabled": False},
}


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``base`` with ``overrides`` merged in (see the module docstring).

    A ``DROP`` for a key ``base`` lacks is kept, so that merging two layers of overrides
    gives one layer that still drops the key from the experiment."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is DROP and key in out:
            del out[key]
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _plain(value: Any) -> Any:
    """Paths as strings (YAML has no Path) and no ``DROP`` left, recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not DROP}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def reference_experiment(*, study: str, n_trials: int, **overrides: Any) -> dict[str, Any]:
    """The experiment as a dict: the shared shape with ``overrides`` deep-merged in."""
    return _plain(deep_merge({"study": study, "n_trials": n_trials, **_BASE}, overrides))


def dump_experiment(doc: dict[str, Any]) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = None  # innermost mappings and lists in flow style: {enabled: true}
    yaml.width = 4096  # one line per key: readable, and greppable by the tests that patch it
    yaml.sort_base_mapping_type_on_output = False  # keys in the order written above
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return buf.getvalue()


def write_reference_experiment(root: Path, *, study: str, n_trials: int, **overrides: Any) -> Path:
    """``root/experiment.yaml``; data/ and backend/config.yaml are the caller's."""
    path = root / "experiment.yaml"
    path.write_text(dump_experiment(reference_experiment(study=study, n_trials=n_trials, **overrides)))
    return path


def copy_backend_config(root: Path) -> Path:
    """``root/backend/config.yaml``: the repository's reference config with its corpus at
    ``root/data/corpus.jsonl`` (what every process-target experiment here points at)."""
    from tuner.ops.demo import write_backend_config

    config = root / "backend" / "config.yaml"
    write_backend_config(BACKEND_CONFIG, config, root / "data" / "corpus.jsonl")
    return config
