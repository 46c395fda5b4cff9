"""The HTTP config channel end to end (issue 28): a study with ``target.channel: http``
reads the reference backend's config from GET /admin/config, writes each trial's
document with PUT (If-Match) and confirms it by reading it back; the backend is never
restarted and no file of the project is patched.

The proof that the values took effect is a comparison: the same fixed variants (the
baseline and three fusion settings) are measured once through the config file, a
restart per trial, and once through the config API; the same backend on the same data
must score each of them the same. After the study the served document is byte-identical
to the one found, and no restore journal is left.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from support.demo_data import copy_demo_subset
from support.http_config import external_backend, http_overrides, served_document
from support.reference_experiment import FUSION_SPACE, copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.errors import ConfigError
from tuner.ops.run import run_experiment
from tuner.study.feasibility import best_feasible_trial
from tuner.study.trial.attrs import ATTR_APPLIED, ATTR_EARLY_STOP, ATTR_VARIANT, assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]
N_IN_SCOPE = 60

VARIANTS = [
    {"name": "rrf-k20-bm25-heavy", "fusion.method": "rrf", "fusion.rrf_k": 20,
     "fusion.weights": {"bm25": 0.7, "dense": 0.3}},
    {"name": "rrf-k5-dense-heavy", "fusion.method": "rrf", "fusion.rrf_k": 5,
     "fusion.weights": {"bm25": 0.2, "dense": 0.8}},
    {"name": "linear-z-balanced", "fusion.method": "linear", "fusion.normalization": "z",
     "fusion.weights": {"bm25": 0.5, "dense": 0.5}},
]


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_demo_subset(tmp_path_factory.mktemp("demo-http") / "data", N_IN_SCOPE)


def project(root: Path, data: Path, study: str, **overrides: Any) -> Path:
    (root / "data").symlink_to(data, target_is_directory=True)
    copy_backend_config(root)
    (root / "shortlist.json").write_text(json.dumps(VARIANTS))
    return write_reference_experiment(root, study=study, n_trials=1 + len(VARIANTS),
                                      storage=f"sqlite:///{root / 'optuna.db'}", shortlist="shortlist.json",
                                      sampler={"type": "random", "seed": 1}, search_space=str(FUSION_SPACE),
                                      **overrides)


def values_by_variant(exp_path: Path) -> tuple[dict[str, Any], list[optuna.trial.FrozenTrial]]:
    """Variant -> its value, or "stopped early" for a trial the OOS constraint stopped."""
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp)
    trials = optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()
    return {t.user_attrs[ATTR_VARIANT]: "stopped early" if t.user_attrs.get(ATTR_EARLY_STOP) else t.value
            for t in trials if t.state.name == "COMPLETE"}, trials


@pytest.fixture(scope="module")
def both(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    file_root, http_root = tmp_path_factory.mktemp("by-file"), tmp_path_factory.mktemp("by-http")
    by_file, _ = values_by_variant(project(file_root, demo_data, "by-file"))
    engine = tmp_path_factory.mktemp("engine")  # the engine's own config and data, outside the project
    (engine / "data").symlink_to(demo_data, target_is_directory=True)
    served = copy_backend_config(engine)
    with external_backend(served) as backend:
        exp_path = project(http_root, demo_data, "by-http", **http_overrides(backend.url))
        before = served_document(backend.url)
        reloads = backend.health().json()["reloads"]
        by_http, trials = values_by_variant(exp_path)
        yield {"file": by_file, "http": by_http, "trials": trials, "before": before, "root": http_root,
               "backend": backend, "reloads": reloads, "exp": exp_path}


def test_the_http_channel_scores_each_variant_as_the_config_file_does(both: dict[str, Any]) -> None:
    names = {"baseline", *(v["name"] for v in VARIANTS)}
    assert set(both["file"]) == names and set(both["http"]) == names
    for name in sorted(names):
        by_file, by_http = both["file"][name], both["http"][name]
        if "stopped early" in (by_file, by_http):
            assert by_file == by_http, name
        else:
            assert math.isclose(by_http, by_file, rel_tol=1e-9, abs_tol=1e-12), name
    measured = [v for v in both["http"].values() if v != "stopped early"]
    assert len(measured) >= 3 and len({round(v, 9) for v in measured}) > 1


def test_the_served_document_is_restored_byte_for_byte_and_nothing_restarted(both: dict[str, Any]) -> None:
    backend = both["backend"]
    assert served_document(backend.url) == both["before"]
    assert [t.user_attrs.get(ATTR_APPLIED) for t in both["trials"]] == ["http"] * len(both["trials"])
    root: Path = both["root"]
    assert not (root / "state" / "restore-journal-http.json").exists()
    # every trial's document went in by PUT (one reload each), never by a restart
    assert backend.health().json()["reloads"] > both["reloads"]
    assert backend.process.poll() is None


def test_each_trial_records_the_document_it_sent(both: dict[str, Any]) -> None:
    root: Path = both["root"]
    by_variant = {t.user_attrs[ATTR_VARIANT]: t for t in both["trials"]}
    trial = by_variant["rrf-k20-bm25-heavy"]
    sent = sorted((root / "state").rglob(f"trial-{trial.number:04d}*/**/http-config.json")) or sorted(
        (root / "state").rglob("http-config.json"))
    assert sent, "no config snapshot of the document sent"
    docs = [json.loads(p.read_text()) for p in sent]
    assert any(d["fusion"]["rrf_k"] == 20 and d["fusion"]["weights"] == pytest.approx({"bm25": 0.7, "dense": 0.3})
               for d in docs)


def test_a_second_run_on_the_same_url_is_refused_naming_the_holder(both: dict[str, Any], tmp_path: Path,
                                                                    demo_data: Path) -> None:
    from tuner.study.storage.file_locks import url_locks

    backend = both["backend"]
    other = project(tmp_path, demo_data, "other-study", **http_overrides(backend.url))
    with url_locks([f"{backend.url}/admin/config"], command="tuner run (the first)"):
        done = subprocess.run([str(Path(sys.executable).with_name("tuner")), "run", str(other)],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode != 0
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and f"config URL {backend.url}/admin/config is locked by tuner run (the first) " \
        f"(pid {os.getpid()} " in err[0], done.stderr
    assert served_document(backend.url) == both["before"]


def test_check_measures_the_document_as_found_and_writes_nothing(both: dict[str, Any]) -> None:
    backend = both["backend"]
    reloads = backend.health().json()["reloads"]
    done = subprocess.run([str(Path(sys.executable).with_name("tuner")), "check", str(both["exp"])],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert backend.health().json()["reloads"] == reloads and served_document(backend.url) == both["before"]


def test_a_key_the_document_lacks_stops_before_any_write(both: dict[str, Any], tmp_path: Path,
                                                         demo_data: Path) -> None:
    backend = both["backend"]
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  fusion.no_such_key: {type: int, low: 1, high: 5}\n")
    exp = project(tmp_path, demo_data, "bad-key", **http_overrides(backend.url))
    text = exp.read_text().replace(str(FUSION_SPACE), str(space))
    exp.write_text(text.replace("shortlist: shortlist.json", "shortlist: []"))
    reloads = backend.health().json()["reloads"]
    with pytest.raises(ConfigError, match=r"fusion\.no_such_key"):
        run_experiment(load_experiment(exp).bind_port())
    assert backend.health().json()["reloads"] == reloads
    assert served_document(backend.url) == both["before"]


def test_apply_rolls_back_through_the_api_when_the_re_measure_misses(both: dict[str, Any]) -> None:
    from tuner.ops.apply import apply_plan, apply_rights, plan_apply

    backend = both["backend"]
    exp = load_experiment(both["exp"])
    trial = next(t for t in both["trials"] if t.user_attrs.get(ATTR_VARIANT) == "rrf-k20-bm25-heavy")
    puts: list[bytes] = []
    with apply_rights(exp):
        wrong = plan_apply(exp, trial_number=trial.number)
        added = [line for line in wrong.diff.splitlines() if line.startswith("+") and "rrf_k" in line]
        assert added and added[0].replace(" ", "").rstrip(",") in ('+"rrf_k":20', '+"rrf_k":20.0'), wrong.diff
        wrong.expected += 0.5  # the re-measured score cannot match: must roll back
        result = apply_plan(wrong, tolerance=0.01, on_step=lambda step: puts.append(served_document(backend.url)))
    assert result.rolled_back and not result.applied, result.message
    assert "tolerance 0.01" in result.message and "original config restored" in result.message
    assert any(body != both["before"] for body in puts)  # the trial's document was served meanwhile
    assert served_document(backend.url) == both["before"]
    assert not (both["root"] / "state" / "restore-journal-http.json").exists()


def test_apply_refuses_a_document_changed_since_the_study(both: dict[str, Any]) -> None:
    backend = both["backend"]
    edited = json.loads(both["before"])
    edited["recency"]["weight"] = 0.25  # a key the study does not tune, edited by hand
    httpx.put(f"{backend.url}/admin/config", json=edited, timeout=60).raise_for_status()
    trial = next(t for t in both["trials"] if t.user_attrs.get(ATTR_VARIANT) == "rrf-k20-bm25-heavy")
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("tuner")), "apply", str(both["exp"]),
                               "--trial", str(trial.number)],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
        assert done.returncode != 0
        err = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(err) == 1 and "changed since the study started" in err[0] and "--force" in err[0], done.stderr
        assert json.loads(served_document(backend.url)) == edited
    finally:
        httpx.put(f"{backend.url}/admin/config", content=both["before"],
                  headers={"Content-Type": "application/json"}, timeout=60).raise_for_status()
    assert served_document(backend.url) == both["before"]


def test_apply_rechecks_writes_reads_back_and_keeps_the_winner(both: dict[str, Any]) -> None:
    backend = both["backend"]
    exp_path: Path = both["exp"]
    done = subprocess.run([str(Path(sys.executable).with_name("tuner")), "apply", str(exp_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    best = best_feasible_trial(both["trials"], maximize=True)
    assert best is not None
    assert done.returncode == 0, done.stdout + done.stderr
    served = json.loads(served_document(backend.url))
    chosen = assignment_of(best)
    if best.user_attrs.get(ATTR_VARIANT) == "baseline":
        assert served_document(backend.url) == both["before"]
    else:
        assert "applied trial #" in done.stdout, done.stdout
        assert served["fusion"]["method"] == chosen["fusion.method"]
        assert served["fusion"]["weights"] == pytest.approx(chosen["fusion.weights"])
    assert not (both["root"] / "state" / "restore-journal-http.json").exists()
    # put the found document back for the other tests of the module
    httpx.put(f"{backend.url}/admin/config", content=both["before"],
              headers={"Content-Type": "application/json"}, timeout=60).raise_for_status()
    assert served_document(backend.url) == both["before"]
