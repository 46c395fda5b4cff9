"""The result cache covers the data the backend serves: the declared ``target.inputs``
files (tuner.data.inputs) and the fingerprint the backend reports on its health URL
(``target.health.fingerprint``). A change is a miss that says which part changed.

The first tests drive a `TrialRunner` over a real config file, a real data file and a
backend that loads both at restart (study.fakes); the last one runs resumed studies of
the importer's Cranfield bundle against the reference backend as a process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from support.reference_experiment import copy_backend_config, write_reference_experiment

from study.fakes import CONFIG_TEXT, FileBackend, FormulaEvaluator, TwoParamSpace, YamlWriter, run_one
from tuner.config.experiment import load_experiment
from tuner.data.inputs import InputsWatch, changed_files, expand, fingerprint_inputs
from tuner.errors import ConfigError, TargetError
from tuner.study.storage.result_cache import ResultCache
from tuner.study.trial.attrs import ATTR_CACHE_NOTE, ATTR_DATA_FINGERPRINT, reports_of, trial_attr
from tuner.study.trial.runner import TrialRunner, compose_runner

optuna.logging.set_verbosity(optuna.logging.WARNING)
PYTHON = sys.executable


def write_atomic(path: Path, text: str) -> None:
    """How a generator rewrites a file: a new inode at the same path."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------ tuner.data.inputs


def test_files_globs_and_directories_expand_sorted_and_hash_their_content(tmp_path: Path) -> None:
    (tmp_path / "data" / "runs" / "deep").mkdir(parents=True)
    (tmp_path / "data" / "corpus.jsonl").write_text("doc\n")
    (tmp_path / "data" / "runs" / "b.trec").write_text("b\n")
    (tmp_path / "data" / "runs" / "deep" / "a.trec").write_text("a\n")
    patterns = [tmp_path / "data" / "corpus.jsonl", str(tmp_path / "data" / "runs")]
    assert [p.relative_to(tmp_path).as_posix() for p in expand(patterns)] == [
        "data/corpus.jsonl", "data/runs/b.trec", "data/runs/deep/a.trec"]
    assert [p.name for p in expand([str(tmp_path / "data" / "**" / "*.trec")])] == ["b.trec", "a.trec"]

    fp = fingerprint_inputs(patterns, root=tmp_path)
    assert fp.files == {
        "data/corpus.jsonl": hashlib.sha256(b"doc\n").hexdigest(),
        "data/runs/b.trec": hashlib.sha256(b"b\n").hexdigest(),
        "data/runs/deep/a.trec": hashlib.sha256(b"a\n").hexdigest(),
    }
    # Declaration order and duplicates do not matter; a byte does.
    assert fingerprint_inputs([*reversed(patterns), patterns[0]], root=tmp_path).digest == fp.digest
    (tmp_path / "data" / "runs" / "b.trec").write_text("B\n")
    again = fingerprint_inputs(patterns, root=tmp_path)
    assert again.digest != fp.digest
    assert changed_files(fp.files, again.files) == ["data/runs/b.trec"]
    (tmp_path / "data" / "runs" / "c.trec").write_text("c\n")
    (tmp_path / "data" / "runs" / "deep" / "a.trec").unlink()
    third = fingerprint_inputs(patterns, root=tmp_path)
    assert changed_files(again.files, third.files) == ["data/runs/c.trec (new)", "data/runs/deep/a.trec (gone)"]


def test_an_unchanged_file_is_hashed_once_and_a_rewritten_one_again(tmp_path: Path, monkeypatch) -> None:
    import tuner.data.inputs

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("one\n")
    watch = InputsWatch([corpus], root=tmp_path)
    # Just written: within the racy window it is hashed on every check.
    watch.current(), watch.current()
    assert watch.memo.hashed == 2
    monkeypatch.setattr(tuner.data.inputs, "RACY_S", 0.0)
    first = watch.current()
    for _ in range(5):
        assert watch.current() == first
    assert watch.memo.hashed == 3  # stat only
    # Same size, same mtime as before: the ctime (and a new inode) still tell.
    st = corpus.stat()
    time.sleep(0.05)
    corpus.write_text("two\n")
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert watch.current().files["corpus.jsonl"] == hashlib.sha256(b"two\n").hexdigest()


def test_target_inputs_resolve_against_the_experiment_file_and_are_checked_at_load(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "queries.jsonl").write_text('{"query_id": "q1", "query": "x"}\n')
    (tmp_path / "data" / "corpus.jsonl").write_text("{}\n")
    copy_backend_config(tmp_path)

    def load(inputs: list[str], **health: Any) -> Any:
        target = {"inputs": inputs, "health": health} if health else {"inputs": inputs}
        return load_experiment(write_reference_experiment(tmp_path, study="s", n_trials=1, target=target))

    exp = load(["data/corpus.jsonl", "data/*.jsonl"], fingerprint="index.sha")
    assert exp.target.inputs == [str(tmp_path / "data" / "corpus.jsonl"), str(tmp_path / "data" / "*.jsonl")]
    assert exp.target.health.fingerprint == "index.sha"
    with pytest.raises(ConfigError) as missing:
        load(["data/corpus.jsonl", "data/corpus2.jsonl"])
    assert "target.inputs[1]: data/corpus2.jsonl does not exist" in str(missing.value)
    assert "generate the data first, or fix the path" in str(missing.value)
    with pytest.raises(ConfigError, match=r"target.inputs\[0\]: data/\*.trec matches no file"):
        load(["data/*.trec"])
    with pytest.raises(ConfigError, match="fingerprint"):
        load(["data/corpus.jsonl"], fingerprint="index..sha")
    # `tuner demo` loads before it generates the data.
    path = write_reference_experiment(tmp_path, study="s", n_trials=1, target={"inputs": ["gone/*.jsonl"]})
    assert load_experiment(path, check_paths=False).target.inputs == [str(tmp_path / "gone" / "*.jsonl")]


# ----------------------------------------------------- the trial runner, over fakes


@dataclass
class DataBackend(FileBackend):
    """Loads its config and a data file at restart; its health answer reports the
    sha256 of the data it loaded (like the reference backend's data_fingerprint)."""

    data: Path | None = None
    served: str | None = None
    health_checks: int = 0

    def restart(self) -> None:
        super().restart()
        assert self.data is not None
        self.served = hashlib.sha256(self.data.read_bytes()).hexdigest()

    def health(self) -> dict[str, Any]:
        self.health_checks += 1
        self.wait_healthy()
        return {"status": "ok", "index": {"sha": self.served}}


def make_runner(root: Path, *, inputs: bool = True, fingerprint: str | None = None, cache: Path | None = None):
    """A runner as `tuner run` builds it (a new one per run: a resumed study)."""
    cfg, data = root / "config.yaml", root / "data" / "corpus.jsonl"
    if not cfg.exists():
        cfg.write_text(CONFIG_TEXT)
        data.parent.mkdir(parents=True)
        data.write_text("doc one\n")
    backend = DataBackend(cfg, data=data)
    backend.start()
    evaluator = FormulaEvaluator(backend)
    runner = compose_runner(
        study_name="s", space=TwoParamSpace(), writer=YamlWriter(cfg), target=backend,
        wait_healthy=backend.health, evaluator=evaluator, trials_dir=root / "trials",
        cache=ResultCache(cache or root / "cache.sqlite"), project_dir=root,
        inputs=InputsWatch([data], root=root) if inputs else None, backend_fingerprint_field=fingerprint,
    )
    return runner, backend, evaluator, data


PARAMS = {"x": 0.3, "k": 40}


def test_a_regenerated_input_file_is_a_miss_that_names_it_and_an_unchanged_one_a_hit(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path)
    first, frozen = run_one(study, runner, PARAMS)
    assert not first.cache_hit
    assert first.cache_note == "cache miss: no result stored for this config and evaluation"
    assert trial_attr(frozen, ATTR_DATA_FINGERPRINT) == {"inputs": first.inputs.digest}
    report = json.loads((tmp_path / "trials" / "0" / "report.json").read_text())
    assert report["context"]["inputs_files"] == {"data/corpus.jsonl": hashlib.sha256(b"doc one\n").hexdigest()}

    runner, backend, evaluator, data = make_runner(tmp_path)  # resumed, data untouched
    second, frozen = run_one(study, runner, PARAMS)
    assert second.cache_hit and evaluator.calls == 0 and backend.restarts == 1  # the start only
    assert trial_attr(frozen, ATTR_CACHE_NOTE) is None and frozen.user_attrs["cached_from_trial"] == 0

    write_atomic(data, "doc one, regenerated\n")
    runner, backend, evaluator, data = make_runner(tmp_path)
    third, frozen = run_one(study, runner, PARAMS)
    assert not third.cache_hit and evaluator.calls == 1
    reason = "cache miss: target.inputs changed (data/corpus.jsonl) since trial #0 of study s"
    assert third.cache_note == reason and trial_attr(frozen, ATTR_CACHE_NOTE) == reason
    assert json.loads((tmp_path / "trials" / "2" / "report.json").read_text())["context"]["cache"] == reason
    # The new result is stored under the new data: the next identical trial hits it.
    fourth, _ = run_one(study, runner, PARAMS)
    assert fourth.cache_hit and evaluator.calls == 1


def test_an_input_regenerated_mid_run_is_seen_before_the_next_trial(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path)
    run_one(study, runner, PARAMS)
    data.write_text("doc one, changed in place\n")
    again, _ = run_one(study, runner, PARAMS)
    assert not again.cache_hit and "target.inputs changed (data/corpus.jsonl)" in again.cache_note


def test_an_input_changing_while_the_trial_runs_keeps_its_result_out_of_the_cache(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path)
    evaluate = evaluator.evaluate

    def evaluate_while_regenerating(**kw: Any) -> Any:
        write_atomic(data, "regenerated during the batch\n")
        return evaluate(**kw)

    evaluator.evaluate = evaluate_while_regenerating  # type: ignore[method-assign]
    first, _ = run_one(study, runner, PARAMS)
    assert first.state == "COMPLETE"
    assert "target.inputs changed while the trial ran (data/corpus.jsonl)" in first.cache_note
    assert len(runner.lookup.cache) == 0


def test_a_changed_backend_fingerprint_is_a_miss(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    old = hashlib.sha256(b"doc one\n").hexdigest()
    first, frozen = run_one(study, runner, PARAMS)
    assert trial_attr(frozen, ATTR_DATA_FINGERPRINT) == {"backend": old}

    runner, backend, evaluator, data = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    second, _ = run_one(study, runner, PARAMS)
    assert second.cache_hit and backend.health_checks == 1  # asked once: the backend the run started

    write_atomic(data, "doc two\n")  # undeclared: only the backend can tell
    runner, backend, evaluator, data = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    third, _ = run_one(study, runner, PARAMS)
    new = hashlib.sha256(b"doc two\n").hexdigest()
    assert not third.cache_hit and evaluator.calls == 1
    assert third.cache_note == (f"cache miss: backend fingerprint changed ({old[:12]}... -> {new[:12]}...)"
                                " since trial #0 of study s")


def test_a_result_is_stored_under_the_fingerprint_its_own_restart_reported(tmp_path: Path) -> None:
    """The running backend serves A; the data on disk is already B. The trial is looked
    up under A (a miss: a new config), restarts onto B and is measured on B, so it is
    stored under B: a backend serving A never gets it as a hit."""
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    run_one(study, runner, {"x": 0.1, "k": 10})  # the running backend now serves A
    serving_a = backend.served
    write_atomic(data, "doc B\n")
    measured, frozen = run_one(study, runner, PARAMS)
    serving_b = hashlib.sha256(b"doc B\n").hexdigest()
    assert measured.backend_fingerprint == serving_b == trial_attr(frozen, ATTR_DATA_FINGERPRINT)["backend"]
    assert f"backend fingerprint after this trial's restart: {serving_b[:12]}... (looked up with {serving_a[:12]}...)" \
        in measured.cache_note

    # A backend serving A: the result measured on B is not a hit.
    runner_a, backend_a, evaluator_a, _ = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    backend_a.served = serving_a
    on_a, _ = run_one(study, runner_a, PARAMS)
    assert not on_a.cache_hit and evaluator_a.calls == 1
    # One serving B: a hit.
    runner_b, backend_b, evaluator_b, _ = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    on_b, _ = run_one(study, runner_b, PARAMS)
    assert on_b.cache_hit and evaluator_b.calls == 0


def test_a_pipelined_trial_is_stored_under_its_own_fingerprint_while_the_next_one_is_served(tmp_path: Path) -> None:
    """In the pipelined loop a trial ends while the next one is served: the backend's
    fingerprint is then the next trial's, or unknown while it reloads (issue 31: a
    reload trial's note said "backend fingerprint after the restart: none"). The trial
    keeps the fingerprint of its own health answer, for the note and the stored key."""
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    run_one(study, runner, {"x": 0.1, "k": 10})  # the running backend now serves A
    serving_a = backend.served
    write_atomic(data, "doc B\n")
    study.enqueue_trial(PARAMS)
    trial = study.ask()
    job = runner.begin(trial)  # looked up under A
    runner.measure(job)  # restarted onto B
    serving_b = hashlib.sha256(b"doc B\n").hexdigest()
    runner.measurer.served.fingerprint = None  # the next trial's serve, mid-reload
    out = runner.end(job)
    study.tell(trial, out.value)
    assert out.state == "COMPLETE" and out.backend_fingerprint == serving_b
    assert out.cache_note.endswith(
        f"backend fingerprint after this trial's restart: {serving_b[:12]}... (looked up with {serving_a[:12]}...)")
    assert trial_attr(study.trials[-1], ATTR_DATA_FINGERPRINT)["backend"] == serving_b
    # stored under B: a backend serving B gets it as a hit
    runner_b, _, evaluator_b, _ = make_runner(tmp_path, inputs=False, fingerprint="index.sha")
    on_b, _ = run_one(study, runner_b, PARAMS)
    assert on_b.cache_hit and evaluator_b.calls == 0


def test_a_fingerprint_field_the_health_answer_lacks_fails_the_trial_naming_the_keys(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path, fingerprint="index.digest")
    outcome, frozen = run_one(study, runner, PARAMS)
    assert outcome.state == "FAIL" and evaluator.calls == 0
    assert outcome.fail_reason == (
        "TargetError: target.health.fingerprint 'index.digest': the health answer has no 'digest' in index"
        " (keys: sha); name a field the backend reports, or remove target.health.fingerprint")


def test_a_health_wait_that_returns_no_body_fails_when_a_fingerprint_is_declared(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    runner, backend, evaluator, data = make_runner(tmp_path, fingerprint="index.sha")
    runner.measurer.served.wait_healthy = backend.wait_healthy  # returns None (the body is dropped)
    outcome, _ = run_one(study, runner, PARAMS)
    assert outcome.state == "FAIL" and "the health wait returned no health answer" in outcome.fail_reason
    with pytest.raises(TargetError):
        runner.measurer.served.observe(None)


# ---------------------------------------- the reference backend's data_fingerprint


def test_the_reference_backends_data_fingerprint_covers_corpus_and_enabled_run_files(tmp_path: Path) -> None:
    from support.backend import write_backend_config

    from fusion_backend.config import load_config
    from fusion_backend.reload import data_fingerprint

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d1", "title": "t", "text": "x"}\n')
    run = tmp_path / "splade.trec"
    run.write_text("q1 Q0 d1 1 2.5 splade\n")

    def fingerprint(enabled: bool) -> str:
        overrides = {"data": {"runs": {"splade": str(run)}}, "sources": {"splade": {"type": "run", "enabled": enabled}}}
        cfg = load_config(write_backend_config(tmp_path / "config.yaml", corpus=corpus, overrides=overrides))
        return data_fingerprint(cfg, "corpus-hash")

    without_run, with_run = fingerprint(False), fingerprint(True)
    assert without_run != with_run
    run.write_text("q1 Q0 d1 1 2.6 splade\n")
    assert fingerprint(True) not in (with_run, without_run)
    assert fingerprint(False) == without_run  # a disabled run is not served


# ---------------------------------------- resumed studies of a real import, real backend


def _import_cranfield(datasets_dir: Path, out: Path, *, n_docs: int, n_queries: int) -> Path:
    """The importer's bundle (its experiment declares the corpus and data_fingerprint),
    cut to the first ``n_docs`` documents and ``n_queries`` queries so a trial is quick."""
    subprocess.run([PYTHON, "-m", "fusion_backend.importers", "cranfield", "--src", str(datasets_dir / "cranfield"),
                    "--out", str(out)], check=True, capture_output=True, text=True)
    for name, keep in (("corpus.jsonl", n_docs), ("cranfield.queries.jsonl", n_queries)):
        path = out / name
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep]))
    return out


def _run(experiment: Any) -> None:
    """`tuner run` for one trial (tuner.study.wiring.build_runner wires target.inputs,
    target.health.fingerprint and the health answer)."""
    from tuner.ops.run import run_experiment

    summary = run_experiment(experiment, n_trials=1, skip_checks=True)
    assert summary.error is None, summary.error


@pytest.mark.slow
@pytest.mark.integration
def test_resumed_studies_of_an_import_hit_until_its_corpus_is_regenerated(datasets_dir: Path, tmp_path: Path) -> None:
    bundle = _import_cranfield(datasets_dir, tmp_path / "cran", n_docs=300, n_queries=40)
    loaded = load_experiment(bundle / "experiment.yaml")
    assert loaded.target.inputs == [str(bundle / "corpus.jsonl")]
    assert loaded.target.health.fingerprint == "data_fingerprint"
    exp = loaded.model_copy(update={"tracking": loaded.tracking.model_copy(update={"enabled": False}),
                                    "holdout": loaded.holdout.model_copy(update={"enabled": False})})

    _run(exp)  # the baseline, measured
    storage = optuna.storages.RDBStorage(exp.storage)
    study = optuna.load_study(study_name=exp.study, storage=storage)
    baseline = study.trials[0]
    assert baseline.state == TrialState.COMPLETE and baseline.user_attrs["cache_hit"] is False
    measured_on = trial_attr(baseline, ATTR_DATA_FINGERPRINT)

    # A resumed study re-runs the baseline's params on unchanged data: a hit.
    study.enqueue_trial(baseline.params)
    _run(exp)
    again = optuna.load_study(study_name=exp.study, storage=storage).trials[-1]
    assert again.user_attrs["cache_hit"] is True and again.user_attrs["cached_from_trial"] == 0
    assert trial_attr(again, ATTR_DATA_FINGERPRINT) == measured_on
    assert again.value == baseline.value

    # The corpus regenerated at the same path (one document's text differs): a miss
    # that names the file and the backend's new fingerprint, measured on the new data.
    corpus = bundle / "corpus.jsonl"
    lines = corpus.read_text().splitlines(keepends=True)
    doc = json.loads(lines[0])
    doc["text"] += " regenerated"
    write_atomic(corpus, "".join([json.dumps(doc) + "\n", *lines[1:]]))
    study.enqueue_trial(baseline.params)
    _run(exp)
    fresh = optuna.load_study(study_name=exp.study, storage=storage).trials[-1]
    assert fresh.state == TrialState.COMPLETE and fresh.user_attrs["cache_hit"] is False
    note = trial_attr(fresh, ATTR_CACHE_NOTE)
    assert note.startswith("cache miss: target.inputs changed (corpus.jsonl); backend fingerprint changed (")
    assert note.endswith(f"since trial #0 of study {exp.study}")  # the hit stored nothing
    data = trial_attr(fresh, ATTR_DATA_FINGERPRINT)
    assert data["inputs"] != measured_on["inputs"] and data["backend"] != measured_on["backend"]
    report = json.loads(Path(reports_of(fresh)["json"]).read_text())
    assert report["context"]["cache"] == note
    assert report["context"]["backend_fingerprint"] == data["backend"]
