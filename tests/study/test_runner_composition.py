"""`TrialRunner` composed from collaborators passed in: the runner only orders them.

A fake measurer and a fake recorder note every call they get; the cache lookup and the
scorer are the real ones, over a real result cache and a real Optuna trial. The order
of the calls and what each one is handed is the runner's whole job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest

from study.fakes import CONFIG_TEXT, TwoParamSpace, YamlWriter, run_one
from tuner.study.storage.result_cache import ResultCache
from tuner.study.trial.cache_lookup import CacheLookup
from tuner.config.objective import Constraint, Objective
from tuner.study.trial.measure import ServedBackend
from tuner.study.trial.outcome import TrialOutcome
from tuner.study.trial.runner import TrialRunner
from tuner.study.trial.scoring import TrialScorer

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class Batch:
    metrics: dict[str, float]


@dataclass
class FakeMeasurer:
    """Measures nothing: notes what it is handed and returns metrics made from the texts."""

    calls: list[tuple[str, Any]]
    served: ServedBackend = field(default_factory=lambda: ServedBackend(lambda: None))

    def prepare(self, texts: Mapping[Path, str]) -> None:
        self.calls.append(("measurer.prepare", sorted(p.name for p in texts)))

    def batch(self, trial: optuna.Trial, out: TrialOutcome, texts: Mapping[Path, str],
              written: Callable[[], None] | None) -> Batch:
        self.calls.append(("measurer.batch", trial.number))
        self.served.touched = True
        if written is not None:
            written()
        x = float(next(iter(texts.values())).split("x: ")[1].split()[0])
        return Batch({"Primary_Metric_Score": 1.0 - x, "OOS_FP_Rate": x / 10})


@dataclass
class FakeRecorder:
    calls: list[tuple[str, Any]]

    def start(self, trial: optuna.Trial, assignment: Mapping[str, Any]) -> None:
        self.calls.append(("recorder.start", dict(assignment)))

    def report_files(self, trial: optuna.Trial, out: TrialOutcome, result: Any, *, sweep: bool,
                     fusion_sweep: bool) -> dict[str, str]:
        self.calls.append(("recorder.report_files", out.state))
        return {"scorecard": f"trials/{trial.number}/scorecard.json"}

    def record(self, trial: optuna.Trial, out: TrialOutcome, texts: Mapping[Path, str], result: Any,
               run_id: Any, sweep: Any = None, fusion_sweep: Any = None) -> None:
        self.calls.append(("recorder.record", (out.state, out.value, out.cache_hit, bool(texts))))

    def flush(self) -> None:
        self.calls.append(("recorder.flush", None))


class Fingerprints:
    dataset_hash, labels_fingerprint, spec_fingerprint = "d", "l", "s"


def composed(tmp_path: Path) -> tuple[TrialRunner, list[tuple[str, Any]]]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_TEXT)
    calls: list[tuple[str, Any]] = []
    writer = YamlWriter(cfg)
    measurer = FakeMeasurer(calls)
    objective = Objective(metric="Primary_Metric_Score", direction="maximize")
    constraints = [Constraint(metric="OOS_FP_Rate", op="<=", bound=0.05)]
    lookup = CacheLookup("s", Fingerprints(), measurer.served, ResultCache(tmp_path / "cache.sqlite"),
                         objective, constraints)
    runner = TrialRunner(space=TwoParamSpace(), writer=writer, lookup=lookup, measurer=measurer,
                         scorer=TrialScorer(objective, constraints), recorder=FakeRecorder(calls))
    return runner, calls


def test_a_trial_is_begun_measured_scored_and_recorded_in_that_order(tmp_path: Path) -> None:
    runner, calls = composed(tmp_path)
    phases: list[str] = []
    runner.on_phase = lambda number, phase: phases.append(phase)
    study = optuna.create_study(direction="maximize")

    outcome, frozen = run_one(study, runner, {"x": 0.3, "k": 20})

    assert calls == [
        ("recorder.start", {"fusion.x": 0.3, "fusion.k": 20}),
        ("measurer.prepare", ["config.yaml"]),
        ("measurer.batch", 0),
        ("recorder.report_files", "COMPLETE"),  # named before the record, so tell finds them
        ("recorder.record", ("COMPLETE", pytest.approx(0.7), False, True)),
    ]
    assert phases == ["suggest", "render", "cache", "complete"]  # the fake measurer times nothing
    # the real scorer set the value and the constraint on the Optuna trial
    assert outcome.value == frozen.value == pytest.approx(0.7)
    assert outcome.constraints == {"OOS_FP_Rate <= 0.05": pytest.approx(-0.02)} and outcome.feasible
    assert outcome.reports == {"scorecard": "trials/0/scorecard.json"}
    assert runner.touched_backend


def test_the_same_config_again_is_a_cache_hit_the_measurer_never_sees(tmp_path: Path) -> None:
    runner, calls = composed(tmp_path)
    study = optuna.create_study(direction="maximize")
    run_one(study, runner, {"x": 0.3, "k": 20})
    calls.clear()

    outcome, frozen = run_one(study, runner, {"x": 0.3, "k": 20})

    assert [name for name, _ in calls] == ["recorder.start", "measurer.prepare", "recorder.record"]
    assert outcome.cache_hit and outcome.value == pytest.approx(0.7)
    assert outcome.reports == {"scorecard": "trials/0/scorecard.json"}  # the first trial's files
    runner.flush()
    assert calls[-1] == ("recorder.flush", None)


def test_a_failed_measure_is_settled_and_recorded_without_scoring(tmp_path: Path) -> None:
    runner, calls = composed(tmp_path)

    def crash(*args: Any) -> Batch:
        calls.append(("measurer.batch", "crash"))
        raise RuntimeError("the backend exited with code 3\nand a second line")

    runner.measurer.batch = crash
    study = optuna.create_study(direction="maximize")

    outcome, frozen = run_one(study, runner, {"x": 0.3, "k": 20})

    assert [name for name, _ in calls] == ["recorder.start", "measurer.prepare", "measurer.batch", "recorder.record"]
    assert calls[-1] == ("recorder.record", ("FAIL", None, False, True))
    assert outcome.fail_reason == "crash: RuntimeError: the backend exited with code 3"  # one line
