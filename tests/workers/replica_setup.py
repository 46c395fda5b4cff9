"""The experiment file the worker tests run (`tuner worker` on the reference backend)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = """
study: {study}
state_dir: state
storage: {storage}
sampler: {{type: tpe, seed: 3, n_startup_trials: 2, constant_liar: true}}
n_trials: {n_trials}
timeout_s: 240
constraints: ["OOS_FP_Rate <= 1.0"]
dataset:
  queries: data/queries.jsonl
  dataset_id: demo
  labels: [{{path: data/qrels.txt, format: qrels}}]
target:
  config_files: [backend/config.yaml]
  apply: process
  port: auto
  process:
    command: ["{{python}}", -m, fusion_backend, serve, --config, "{{config}}", --port, "{{port}}"]
    stop_timeout_s: 10
  health: {{url: "http://127.0.0.1:{{port}}/health", deadline_s: 90, interval_s: 0.1}}
evaluation:
  request: {{url: "http://127.0.0.1:{{port}}/search", body: {{query: "{{query}}", top_k: "{{top_k}}"}}}}
  response: {{confidence: confidence, handoff: handoff, fallback_level: fallback_level}}
  top_k: 20
  concurrency: 4
search_space: {space}
tracking: {{enabled: false}}
baseline: true
"""


def write_experiment(root: Path, *, study: str, storage: str, n_trials: int) -> Path:
    """experiment.yaml in ``root``; data/ and backend/config.yaml are the caller's."""
    path = root / "experiment.yaml"
    path.write_text(EXPERIMENT.format(study=study, storage=storage, n_trials=n_trials,
                                      space=REPO / "search_space" / "reference_fusion.yaml"))
    return path
