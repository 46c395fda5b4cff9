"""The baseline trial measures the config as found (issue 26, item 4): on a real search
space, config patcher (with its restore journal) and Optuna study, with a backend whose
score depends on the weights as written (it does not divide by their sum).

Trial #0 writes nothing (the file keeps its bytes, inode and mtime while the backend
serves it), records the file's values (1.0/1.0, not the simplex's 0.5/0.5) and scores
them; a later trial that keeps the weights leaves their line alone.
"""

from __future__ import annotations

import hashlib
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from ruamel.yaml import YAML

from study.fakes import FormulaEvaluator, run_one
from tuner.config.configpatch import ConfigPatcher
from tuner.config.space.loading import load_space
from tuner.study.storage.queue import enqueue_initial
from tuner.study.storage.study_storage import ATTR_CONFIG_SEEN
from tuner.study.trial.attrs import assignment_of
from tuner.study.trial.runner import TrialRunner, compose_runner
from tuner.study.wiring import PatcherWriter, initial_variants, record_config_seen

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

CONFIG = """\
# production config: the backend adds weighted scores as they are
fusion:
  rrf_k: 60            # RRF constant
  weights: {bm25: 1.0, dense: 1.0}   # not divided by their sum
"""
SPACE = """\
params:
  fusion.rrf_k: {type: int, low: 5, high: 200}
  fusion.weights: {type: simplex, components: [bm25, dense]}
"""


@dataclass
class FileState:
    """A target that 'loads' the config file at each restart and notes its bytes and inode."""

    path: Path
    loaded: dict[str, Any] = field(default_factory=dict)
    seen: list[tuple[str, int, int]] = field(default_factory=list)

    def start(self) -> None:
        self.restart()

    def restart(self) -> None:
        stat = self.path.stat()
        self.seen.append((hashlib.sha256(self.path.read_bytes()).hexdigest(), stat.st_ino, stat.st_mtime_ns))
        self.loaded = YAML(typ="safe").load(self.path.read_text())

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def failure(self) -> str | None:
        return None

    def wait_healthy(self) -> None: ...


@dataclass
class SumEvaluator(FormulaEvaluator):
    """Scores the weights as loaded: 1.0/1.0 and 0.5/0.5 score differently."""

    def evaluate(self, *, order_seed: int, on_result: Any) -> Any:
        from study.fakes import FakeResult

        self.calls += 1
        w = self.backend.loaded["fusion"]["weights"]  # type: ignore[attr-defined]
        score = 0.1 * w["bm25"] + 0.2 * w["dense"] + 0.001 * self.backend.loaded["fusion"]["rrf_k"]  # type: ignore[attr-defined]
        return FakeResult({"Primary_Metric_Score": score, "OOS_FP_Rate": 0.0, "Judged@10": 1.0})


def _setup(tmp_path: Path, variants: list[Any]) -> tuple[TrialRunner, FileState, optuna.Study, Path]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    (tmp_path / "space.yaml").write_text(textwrap.dedent(SPACE))
    space = load_space(tmp_path / "space.yaml", [cfg])
    patcher = ConfigPatcher([cfg], journal_path=tmp_path / "journal.json")
    target = FileState(cfg)
    runner = compose_runner(study_name="s", space=space, writer=PatcherWriter(space, patcher), target=target,
                         wait_healthy=target.wait_healthy, evaluator=SumEvaluator(target),  # type: ignore[arg-type]
                         trials_dir=tmp_path / "trials")
    prepared = SimpleNamespace(experiment=SimpleNamespace(baseline=True, variants=variants), space=space,
                               patcher=patcher, found_documents=patcher.documents)
    study = optuna.create_study(direction="maximize")
    enqueue_initial(study, initial_variants(prepared))  # type: ignore[arg-type]
    record_config_seen(study, prepared)  # type: ignore[arg-type]
    target.start()
    return runner, target, study, cfg


def test_trial_zero_writes_nothing_and_records_and_scores_the_files_values(tmp_path: Path) -> None:
    runner, target, study, cfg = _setup(tmp_path, [])
    before = target.seen[0]
    outcome, frozen = run_one(study, runner)
    assert outcome.state == "COMPLETE"
    assert target.seen[1] == before  # restarted on the same bytes, same inode, same mtime: nothing written
    assert cfg.read_text() == CONFIG
    assert assignment_of(frozen) == {"fusion.rrf_k": 60, "fusion.weights": {"bm25": 1.0, "dense": 1.0}}
    assert frozen.params["fusion.weights.bm25"] == 1.0 and frozen.params["fusion.weights.dense"] == 1.0
    assert frozen.value == pytest.approx(0.1 + 0.2 + 0.06)  # the weights as written, not 0.5/0.5 (0.21)
    assert study.user_attrs[ATTR_CONFIG_SEEN]["fusion.weights"] == {"bm25": 1.0, "dense": 1.0}
    # the snapshot kept with the trial is the file as found
    assert (tmp_path / "trials" / "0" / "config.yaml").read_text() == CONFIG


def test_a_trial_that_keeps_the_weights_leaves_their_line(tmp_path: Path) -> None:
    keep = SimpleNamespace(name="k30", values={"fusion.rrf_k": 30, "fusion.weights": {"bm25": 1.0, "dense": 1.0}})
    runner, target, study, cfg = _setup(tmp_path, [keep])
    run_one(study, runner)
    outcome, frozen = run_one(study, runner)
    assert outcome.state == "COMPLETE" and frozen.user_attrs["variant"] == "k30"
    written = (tmp_path / "trials" / "1" / "config.yaml").read_text()
    assert written == CONFIG.replace("rrf_k: 60 ", "rrf_k: 30 ")
    assert assignment_of(frozen)["fusion.weights"] == {"bm25": 1.0, "dense": 1.0}
    assert frozen.value == pytest.approx(0.1 + 0.2 + 0.03)
