"""The whole apply path against the reference backend: patch -> restart -> health -> /admin/config."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import optuna
import pytest
from support.integration import need

from tuner.config.configpatch import ConfigPatcher
from tuner.config.experiment import free_port
from tuner.config.space.loading import load_space
from tuner.config.target import ProcessConfig
from tuner.targets.health import wait_healthy
from tuner.targets.process import ProcessTarget

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _small_corpus(tmp_path: Path, n_docs: int = 150) -> Path:
    from support.demo_data import copy_demo_data

    demo = tmp_path / "demo"
    copy_demo_data(demo)
    corpus = tmp_path / "corpus.jsonl"
    lines = (demo / "corpus.jsonl").read_text().splitlines()[:n_docs]
    corpus.write_text("\n".join(lines) + "\n")
    return corpus


def test_patched_config_takes_effect_and_restore_brings_the_original_back(tmp_path: Path) -> None:
    need(importlib.util.find_spec("fusion_backend.datagen") is not None, "reference backend (fusion_backend) not installed")
    from support.backend import write_backend_config

    config = write_backend_config(tmp_path / "backend" / "config.yaml", corpus=_small_corpus(tmp_path))
    original = config.read_bytes()
    space = load_space(REPO / "search_space" / "reference_full.yaml", [config])
    patcher = ConfigPatcher([config], tmp_path / "state" / "journal.json")
    assert space.validate_against(patcher.documents(), patcher.names) == []

    variant = {
        "fusion.method": "linear",
        "fusion.normalization": "z",
        "fusion.weights": {"bm25": 0.3, "dense": 0.7},
        "confidence.threshold": 0.35,
        "fallback.windows_days": [14, 60],
        "recency.half_life_days": 90,
        "recency.weight": 0.25,
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(space.params_for(variant))
    assignment = space.suggest(study.ask())

    port = free_port()
    command = ["{python}", "-m", "fusion_backend", "serve", "--config", "{config}", "--port", "{port}"]
    target = ProcessTarget(ProcessConfig(command=command), config_files=[config], port=port, state_dir=tmp_path / "state")
    health = f"http://127.0.0.1:{port}/health"
    admin = f"http://127.0.0.1:{port}/admin/config"
    with target:
        target.start()
        before = wait_healthy(health, deadline_s=120, target=target)
        assert httpx.get(admin).json()["fusion"]["method"] == "rrf"

        patcher.apply(space.edits(assignment))
        target.restart()
        after = wait_healthy(health, deadline_s=120, target=target)
        live = httpx.get(admin).json()
        assert after["config_hash"] != before["config_hash"]
        for name, value in assignment.items():
            got: object = live
            for seg in name.split("."):
                got = got[seg]  # type: ignore[index]
            expected = value if not isinstance(value, dict) else {k: pytest.approx(v) for k, v in value.items()}
            assert got == (pytest.approx(expected) if isinstance(expected, float | int) else expected), name
        assert live["fusion"]["rrf_k"] == 60  # inactive under linear: not written, the config keeps it

        patcher.restore()
        assert config.read_bytes() == original
        target.restart()
        again = wait_healthy(health, deadline_s=120, target=target)
        assert again["config_hash"] == before["config_hash"]
    assert json.loads(json.dumps(assignment))  # the assignment is plain data (loggable as params)
