"""A trial with a post-retrieval gate: the retrieval runs at the gate's low end, the
runner solves the gate from the batch, records the solved value and the sweep, and a
cache hit restores the solved value. The batch is a real BatchResult (the evaluation
core on synthetic responses); expected values come from tuner.study.gates.threshold.solve on it."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from ruamel.yaml import YAML
from threshold.test_threshold import synthetic_batch

from study.fakes import FileBackend, YamlWriter
from tuner.config.space.loading import load_space
from tuner.evaluation.result import evaluate_responses
from tuner.report import ReportContext, write_reports
from tuner.study.gates.threshold import CONFIDENCE_PARAM, Retrieval, solvable_gates, solve
from tuner.study.storage.result_cache import ResultCache
from tuner.study.trial.attrs import assignment_of, trial_attr
from tuner.config.objective import Constraint
from tuner.study.trial.runner import TrialRunner, compose_runner

optuna.logging.set_verbosity(optuna.logging.WARNING)
BOUND = 0.3
CONFIG = "fusion:\n  x: 0.5\nconfidence:\n  threshold: 0.6\n"
SPACE = """\
params:
  fusion.x: {type: float, low: 0.0, high: 1.0}
  confidence.threshold: {type: float, low: 0.2, high: 0.8, step: 0.05, post_retrieval: true}
"""


class BatchEvaluator:
    """Returns the same real batch whatever the backend loaded, and notes the gate it ran with."""

    dataset_hash, labels_fingerprint, spec_fingerprint = "d", "l", "s"
    last_search_seconds = 0.0

    def __init__(self, backend: FileBackend, batch: Any, gate_key: str = "confidence.threshold") -> None:
        self.backend, self.batch, self.gate_key = backend, batch, gate_key
        self.calls: list[float] = []
        self.written: list[Any] = []

    def evaluate(self, *, order_seed: int, on_result: Any) -> Any:
        section, key = self.gate_key.split(".")
        self.calls.append(float(self.backend.loaded[section][key]))
        return self.batch

    def report_paths(self, result: Any, out_dir: Path, *, detail: str = "full") -> dict[str, Path]:
        return {"json": out_dir / "report.json", "per_query_csv": out_dir / "report_per_query.csv"}

    def write_reports(
        self, result: Any, out_dir: Path, *, context: Any, config_snapshot: str, detail: str = "full",
        pr_curve: str | None = None,
    ) -> dict[str, Path]:
        # the real report writer, as the live evaluator calls it
        self.written.append(result)
        paths = write_reports(result, out_dir, context=ReportContext(extra=dict(context)),
                              config_snapshot=config_snapshot)
        return {"json": paths.json, "per_query_csv": paths.per_query_csv}


# Another backend's name for the same confidence gate, declared by role.
RENAMED_CONFIG = "fusion:\n  x: 0.5\nrag:\n  min_confidence: 0.6\n"
RENAMED_SPACE = SPACE.replace("confidence.threshold:", "rag.min_confidence:").replace(
    "post_retrieval: true", "gate: confidence")


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    return make_setup(tmp_path, CONFIG, SPACE, "confidence.threshold")


def make_setup(tmp_path: Path, config: str, space_text: str, gate_key: str) -> dict[str, Any]:
    tmp_path.mkdir(exist_ok=True)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config)
    (tmp_path / "space.yaml").write_text(textwrap.dedent(space_text))
    space = load_space(tmp_path / "space.yaml", [cfg])
    qs, qrels, responses, failed = synthetic_batch(1)
    batch = evaluate_responses(qs, qrels, responses, failed)
    backend = FileBackend(cfg)
    evaluator = BatchEvaluator(backend, batch, gate_key)
    constraint = Constraint(metric="OOS_FP_Rate", op="<=", bound=BOUND)
    runner = compose_runner(
        study_name="s", space=space, writer=YamlWriter(cfg), target=backend, wait_healthy=lambda: None,
        evaluator=evaluator, trials_dir=tmp_path / "trials", constraints=[constraint],
        cache=ResultCache(tmp_path / "cache.sqlite"),
        gates=dict(zip(sorted(space.post_retrieval), solvable_gates(space), strict=True)),
    )
    expected = solve(Retrieval.from_batch(batch), solvable_gates(space), constraints=[constraint])
    return {"runner": runner, "evaluator": evaluator, "space": space, "batch": batch, "expected": expected,
            "tmp": tmp_path, "study": optuna.create_study(direction="maximize")}


def run(study: optuna.Study, runner: TrialRunner, params: dict | None = None) -> Any:
    if params is not None:
        study.enqueue_trial(params)
    trial = study.ask()
    out = runner.run(trial)
    study.tell(trial, out.value) if out.state == "COMPLETE" else study.tell(trial, state=TrialState.FAIL)
    runner.flush()
    return out, study.trials[-1]


def test_a_free_trial_retrieves_at_the_low_end_and_records_the_solved_gate(setup: dict[str, Any]) -> None:
    runner, evaluator, expected, tmp = setup["runner"], setup["evaluator"], setup["expected"], setup["tmp"]
    out, frozen = run(setup["study"], runner, {"fusion.x": 0.25})
    assert out.state == "COMPLETE" and evaluator.calls == [0.2]  # retrieved with the gate at low
    solved = expected.values[CONFIDENCE_PARAM]
    assert out.value == pytest.approx(expected.objective, abs=1e-12)
    assert out.metrics["OOS_FP_Rate"] == pytest.approx(expected.metrics["OOS_FP_Rate"], abs=1e-12)
    assert out.constraints["OOS_FP_Rate <= 0.3"] == pytest.approx(expected.metrics["OOS_FP_Rate"] - BOUND)
    assert assignment_of(frozen) == {"fusion.x": 0.25, CONFIDENCE_PARAM: solved}
    assert out.metrics[f"solved.{CONFIDENCE_PARAM}"] == solved
    # The sampler did not draw it (the retrieval ran at the low end); the solved value is
    # recorded as a param afterwards, under the space's declared distribution.
    assert frozen.params == {"fusion.x": 0.25, CONFIDENCE_PARAM: solved}
    assert frozen.distributions[CONFIDENCE_PARAM] == optuna.distributions.FloatDistribution(0.2, 0.8, step=0.05)
    trial_dir = tmp / "trials" / str(frozen.number)
    snapshot = YAML(typ="safe").load((trial_dir / "config.yaml").read_text())
    assert snapshot["confidence"]["threshold"] == solved and snapshot["fusion"]["x"] == 0.25
    rows = list(csv.DictReader((trial_dir / "threshold_sweep.csv").open()))
    # One gate: the slim sweep keeps every grid row (10 significant digits) and marks the chosen one.
    assert len(rows) == len(expected.table) == 13  # 0.2, 0.25, ..., 0.8
    assert max(float(r["Primary_Metric_Score"]) for r in rows if float(r["OOS_FP_Rate"]) <= BOUND) == \
        pytest.approx(out.value, abs=1e-9)
    assert [float(r[CONFIDENCE_PARAM]) for r in rows if r["chosen"] == "True"] == [pytest.approx(solved)]


def test_the_experiment_can_ask_for_the_whole_sweep_at_full_precision(setup: dict[str, Any]) -> None:
    runner, tmp = setup["runner"], setup["tmp"]
    runner.recorder.report_detail = "full"  # tracking.report_detail: full
    out, frozen = run(setup["study"], runner, {"fusion.x": 0.25})
    rows = list(csv.DictReader((tmp / "trials" / str(frozen.number) / "threshold_sweep.csv").open()))
    assert len(rows) == len(setup["expected"].table) and "chosen" not in rows[0]
    assert max(float(r["Primary_Metric_Score"]) for r in rows if float(r["OOS_FP_Rate"]) <= BOUND) == \
        pytest.approx(out.value, abs=1e-15)


def test_a_cache_hit_restores_the_solved_gate_without_evaluating(setup: dict[str, Any]) -> None:
    runner, evaluator, study = setup["runner"], setup["evaluator"], setup["study"]
    first, _ = run(study, runner, {"fusion.x": 0.25})
    again, frozen = run(study, runner, {"fusion.x": 0.25})
    assert again.cache_hit and len(evaluator.calls) == 1
    assert again.assignment == first.assignment and again.value == first.value
    assert assignment_of(frozen)[CONFIDENCE_PARAM] == setup["expected"].values[CONFIDENCE_PARAM]


def test_a_trial_queued_with_a_gate_value_is_measured_at_it(setup: dict[str, Any]) -> None:
    runner, evaluator, batch = setup["runner"], setup["evaluator"], setup["batch"]
    out, frozen = run(setup["study"], runner, setup["space"].params_for({"fusion.x": 0.5, CONFIDENCE_PARAM: 0.6}))
    assert evaluator.calls == [0.6]  # the baseline's own gate, not the low end
    assert out.value == pytest.approx(batch.metrics["Primary_Metric_Score"], abs=1e-12)
    assert not any(k.startswith("solved.") for k in out.metrics)
    assert assignment_of(frozen)[CONFIDENCE_PARAM] == 0.6
    assert not (setup["tmp"] / "trials" / str(frozen.number) / "threshold_sweep.csv").exists()


def test_a_solved_trials_report_describes_the_batch_at_the_solved_gate(setup: dict[str, Any]) -> None:
    runner, batch, tmp = setup["runner"], setup["batch"], setup["tmp"]
    out, frozen = run(setup["study"], runner, {"fusion.x": 0.25})
    solved = out.metrics[f"solved.{CONFIDENCE_PARAM}"]
    trial_dir = tmp / "trials" / str(frozen.number)
    report = json.loads((trial_dir / "report.json").read_text())
    card = report["scorecard"]
    assert card  # every scorecard key is the trial's own value, so the report matches the score
    for name, value in card.items():
        assert value == pytest.approx(out.metrics[name], abs=1e-12, nan_ok=True), name
    assert card["Primary_Metric_Score"] == pytest.approx(out.value, abs=1e-12)
    assert frozen.user_attrs["judged@10"] == card["Judged@10"]
    assert report["context"]["solved_gates"] == {CONFIDENCE_PARAM: solved}
    # the per-query CSV: a query is answered iff it is in scope or OOS, did not fail and
    # its confidence reaches the solved threshold (the synthetic retrieval handed off below 0.6)
    rows = {r["query_id"]: r for r in csv.DictReader((trial_dir / "report_per_query.csv").open())}
    for q in batch.queries:
        conf = batch.per_query.loc[q.query_id, "confidence"]
        ok = batch.per_query.loc[q.query_id, "status"] == "ok"
        expected = (conf >= solved) if ok else (q.scope == "oos")
        assert (rows[q.query_id]["answered"] == "True") == bool(expected), q.query_id
    assert batch.metrics["Primary_Metric_Score"] != pytest.approx(out.value)  # the raw batch differs


def test_a_renamed_gate_is_solved_and_reported_like_the_reference_key(setup: dict[str, Any], tmp_path: Path) -> None:
    other = make_setup(tmp_path / "renamed", RENAMED_CONFIG, RENAMED_SPACE, "rag.min_confidence")
    ref_out, ref_frozen = run(setup["study"], setup["runner"], {"fusion.x": 0.25})
    out, frozen = run(other["study"], other["runner"], {"fusion.x": 0.25})
    key = "rag.min_confidence"
    assert other["evaluator"].calls == [0.2]  # retrieved at the renamed gate's low end
    solved = ref_out.metrics[f"solved.{CONFIDENCE_PARAM}"]
    assert out.value == ref_out.value and out.constraints == ref_out.constraints
    assert out.metrics == {(f"solved.{key}" if k == f"solved.{CONFIDENCE_PARAM}" else k): v
                           for k, v in ref_out.metrics.items()}
    assert assignment_of(frozen) == {"fusion.x": 0.25, key: solved}
    ref_dir, trial_dir = (s["tmp"] / "trials" / str(f.number) for s, f in ((setup, ref_frozen), (other, frozen)))
    snapshot = YAML(typ="safe").load((trial_dir / "config.yaml").read_text())
    assert snapshot["rag"]["min_confidence"] == solved and "confidence" not in snapshot
    # The sweep CSV says what was solved: the same table, its gate column named by the key.
    ref_csv, csv_text = ((d / "threshold_sweep.csv").read_text().splitlines() for d in (ref_dir, trial_dir))
    assert csv_text[0] == ref_csv[0].replace(CONFIDENCE_PARAM, key) and csv_text[1:] == ref_csv[1:]
    assert csv_text[0].split(",")[0] == key
    report, ref_report = (json.loads((d / "report.json").read_text()) for d in (trial_dir, ref_dir))
    assert report["context"]["solved_gates"] == {key: solved}
    assert report["scorecard"] == ref_report["scorecard"]
    ref_rows, rows = ((d / "report_per_query.csv").read_text() for d in (ref_dir, trial_dir))
    assert rows == ref_rows


def test_the_studys_pruning_callback_reads_gates_by_role() -> None:
    from types import SimpleNamespace

    from tuner.config.objective import Constraint as ExpConstraint
    from tuner.data.dataset import Query, QuerySet
    from tuner.study.gates.threshold import GateRange
    from tuner.study.wiring import reporters_for

    qs = QuerySet("d", "h", (Query("q", "t", "x", "s", "in"), Query("o", "t", "x", "s", "oos")))
    exp = SimpleNamespace(constraints=[ExpConstraint.parse("OOS_FP_Rate <= 0.5")],
                          objective=SimpleNamespace(metric="Primary_Metric_Score"))
    nop = optuna.pruners.NopPruner()

    def made(*gates: GateRange) -> Any:
        factory = reporters_for(exp, nop, qs, {g.param: g for g in gates})
        return None if factory is None else factory(optuna.create_study().ask())

    conf = made(GateRange("rag.min_confidence", 0.1, 0.7, role="confidence"))
    assert conf.oos_threshold_max == made(GateRange(CONFIDENCE_PARAM, 0.1, 0.7)).oos_threshold_max == 0.7
    # a solved score cut-off can empty lists the per-query rows cannot show: no OOS early stop
    assert made(GateRange("rag.cutoff", 0.0, 0.5, role="min_score")) is None
    assert made(GateRange("citation.min_score", 0.0, 0.5)) is None


WIDE_CONFIG = "fusion:\n  x: 0.5\nconfidence:\n  threshold: 0.12\n"
WIDE_SPACE = SPACE.replace("low: 0.2, high: 0.8, step: 0.05", "low: 0.0, high: 0.6, step: 0.01")


@pytest.mark.parametrize("bound", [None, 0.1])
def test_a_gate_keeps_its_value_as_found_unless_a_constraint_moves_it_and_the_trial_says_so(
        tmp_path: Path, bound: float | None) -> None:
    from optuna_dashboard._note import get_note_from_system_attrs
    from threshold.test_gate_choice import wide_ties_batch

    from tuner.study.storage.study_storage import ATTR_CONFIG_SEEN
    from tuner.study.trial.attrs import ATTR_GATES_MOVED
    from tuner.study.wiring import Prepared, gates_as_found

    setup = make_setup(tmp_path, WIDE_CONFIG, WIDE_SPACE, "confidence.threshold")
    runner, study, space = setup["runner"], setup["study"], setup["space"]
    runner.evaluator.batch = wide_ties_batch()  # the objective is flat from 0 to 0.55
    runner.scorer.constraints = runner.lookup.constraints = runner.recorder.constraints = [] if bound is None else [
        Constraint(metric="OOS_FP_Rate", op="<=", bound=bound)]
    study.set_user_attr(ATTR_CONFIG_SEEN, {"fusion.x": 0.5, CONFIDENCE_PARAM: 0.12})
    prepared = Prepared(None, space, None, None, {}, "", [], [],  # type: ignore[arg-type]
                        gates=dict(zip(sorted(space.post_retrieval), solvable_gates(space), strict=True)))
    runner.gates = runner.recorder.gates = gates_as_found(prepared, study)  # as tuner run builds it: the study's baseline
    assert runner.gates[CONFIDENCE_PARAM].found == 0.12
    out, frozen = run(study, runner, {"fusion.x": 0.25})
    note = get_note_from_system_attrs(study._storage.get_study_system_attrs(study._study_id),
                                      frozen._trial_id)["body"]
    if bound is None:  # nothing asks the gate to move: the value as found, and no word about it
        assert assignment_of(frozen)[CONFIDENCE_PARAM] == 0.12
        assert out.gates_moved is None and trial_attr(frozen, ATTR_GATES_MOVED) is None
        assert "moved" not in note
    else:  # only a threshold above every OOS confidence (0.4) meets the bound
        moved = ("OOS_FP_Rate <= 0.1 moved confidence.threshold 0.12 -> 0.48 (+0.36): at the value as found, "
                 "OOS_FP_Rate = 1")
        assert assignment_of(frozen)[CONFIDENCE_PARAM] == 0.48
        assert out.gates_moved == trial_attr(frozen, ATTR_GATES_MOVED) == moved
        assert ATTR_GATES_MOVED not in frozen.user_attrs  # a sentence: kept off the dashboard's table
        assert f"- gates moved by a constraint: {moved}" in note
