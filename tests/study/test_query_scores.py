"""tuner.study.query_scores: each trial's compact per-query record, read back as the
cross-validation's candidates; and the estimate in the study note and the MLflow parent run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest

from tuner.config.objective import Constraint, Objective
from tuner.config.validation import CrossValConfig
from tuner.study.notes import publish_study
from tuner.study.query_scores import (
    ATTR_PER_QUERY,
    build_record,
    queries_of,
    save_record,
    settings_record,
    study_crossval,
    study_scores,
)
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_CACHED_FROM, ATTR_VARIANT, set_record, trial_attr

optuna.logging.set_verbosity(optuna.logging.WARNING)
OOS_RULE = Constraint.parse("OOS_FP_Rate <= 0.25")
JUDGED_RULE = Constraint.parse("Judged@10 >= 0.5")
N_IN, N_OOS = 40, 8


def _per_query(scores: np.ndarray, answered_oos: np.ndarray, judged: np.ndarray | None = None) -> pd.DataFrame:
    """A batch's per-query frame as tuner.evaluation.result builds it (the columns used here)."""
    ids = [f"q{i:02d}" for i in range(N_IN)] + [f"o{i}" for i in range(N_OOS)]
    judged = np.full(N_IN, 0.9) if judged is None else judged
    return pd.DataFrame(
        {
            "query_type": ["howto" if i % 2 else "lookup" for i in range(N_IN)] + ["oos"] * N_OOS,
            "scope": ["in"] * N_IN + ["oos"] * N_OOS,
            "answered": np.concatenate([np.ones(N_IN, dtype=bool), answered_oos.astype(bool)]),
            "Primary_Metric_Score": np.concatenate([scores, np.full(N_OOS, np.nan)]),
            "Judged@10": np.concatenate([judged, np.full(N_OOS, np.nan)]),
        },
        index=pd.Index(ids, name="query_id"),
    )


def _metrics(frame: pd.DataFrame) -> dict[str, float]:
    oos = frame[frame["scope"] == "oos"]
    ins = frame[frame["scope"] != "oos"]
    return {
        "Primary_Metric_Score": float(ins["Primary_Metric_Score"].mean()),
        "OOS_FP_Rate": float(oos["answered"].mean()),
        "Judged@10": float(ins["Judged@10"].mean()),
    }


def _tell(study: optuna.Study, frame: pd.DataFrame, constraints: list[Constraint], variant: str = "") -> int:
    trial = study.ask()
    metrics = _metrics(frame)
    if variant:
        trial.set_user_attr(ATTR_VARIANT, variant)
    for c in constraints:
        trial.set_constraint(c.name, c.violation(metrics))
    record = build_record(frame, metrics, "Primary_Metric_Score", constraints)
    assert record is not None
    save_record(trial, record, queries_of(frame), set())
    study.tell(trial, metrics["Primary_Metric_Score"])
    return trial.number


def test_a_record_reproduces_the_trials_scores_and_is_compact() -> None:
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, N_IN)
    answered = np.array([1, 0, 0, 0, 1, 0, 0, 0])
    frame = _per_query(scores, answered)
    record = build_record(frame, _metrics(frame), "Primary_Metric_Score", [OOS_RULE, JUDGED_RULE])
    assert record is not None
    assert np.allclose(record["objective"], scores, atol=1e-5)
    assert record["oos_answered"] == "10001000"
    assert np.allclose(record["metrics"]["Judged@10"], 0.9)
    assert len(json.dumps(record)) < 20 * N_IN  # two float columns of N_IN, the OOS bits
    latency = Constraint.parse("Latency_P95_ms <= 200")  # not a per-query mean: no per-query values
    without = build_record(frame, _metrics(frame), "Primary_Metric_Score", [latency])
    assert without is not None and "metrics" not in without


def test_the_study_reads_back_candidates_baseline_and_cache_hits() -> None:
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.5, N_IN)
    quiet = np.zeros(N_OOS)
    b = _tell(study, _per_query(base, quiet), [OOS_RULE], variant="baseline")
    better = _tell(study, _per_query(base + 0.1, quiet), [OOS_RULE])
    hit = study.ask()  # a cache hit: no record, the trial it was copied from has one
    hit.set_user_attr(ATTR_CACHED_FROM, better)
    hit.set_constraint(OOS_RULE.name, -0.25)
    study.tell(hit, float((base + 0.1).mean()))
    stranger = study.ask()  # copied from trial #1 of another study (the cache is shared): another assignment
    set_record(stranger, ATTR_ASSIGNMENT, {"fusion.rrf_k": 7})
    stranger.set_user_attr(ATTR_CACHED_FROM, better)
    stranger.set_constraint(OOS_RULE.name, -0.25)
    study.tell(stranger, 0.3)
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)

    scores = study_scores(study, "Primary_Metric_Score", [OOS_RULE])
    assert scores is not None
    assert [c.number for c in scores.candidates] == [b, better, hit.number]  # not the stranger
    assert scores.baseline is not None and scores.baseline.number == b
    assert np.allclose(scores.candidates[2].objective[:N_IN], base + 0.1, atol=1e-5)
    assert np.isnan(scores.candidates[0].objective[N_IN:]).all()
    assert np.array_equal(scores.candidates[0].metrics["OOS_FP_Rate"][N_IN:], quiet)
    assert [q.scope for q in scores.queries].count("oos") == N_OOS
    assert scores.notes == [
        "1 complete trial(s) without per-query scores (OOS early stops, copies of another study's trials, older trials) left out"
    ]


def test_trials_on_another_query_set_and_without_records_are_named() -> None:
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(2)
    frame = _per_query(rng.uniform(0, 1, N_IN), np.zeros(N_OOS))
    _tell(study, frame.iloc[1:], [OOS_RULE])  # one query fewer: another list
    _tell(study, frame, [OOS_RULE])
    bare = study.ask()
    bare.set_constraint(OOS_RULE.name, 0.5)
    study.tell(bare, 0.9)  # an OOS early stop: COMPLETE without a record
    scores = study_scores(study, "Primary_Metric_Score", [OOS_RULE])
    assert scores is not None and [c.number for c in scores.candidates] == [1]
    assert any("another query set" in n for n in scores.notes)
    assert any("without per-query scores" in n for n in scores.notes)
    assert trial_attr(study.trials[2], ATTR_PER_QUERY) is None


class _Tracker:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def summarize_study(self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        self.calls.append({"note": note, "metrics": dict(metrics), "tags": dict(tags)})


def test_the_study_note_and_the_parent_run_carry_the_estimate() -> None:
    from optuna_dashboard import get_note

    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(3)
    base = rng.uniform(0.2, 0.5, N_IN)
    _tell(study, _per_query(base, np.zeros(N_OOS)), [OOS_RULE], variant="baseline")
    for _ in range(6):
        _tell(study, _per_query(base + 0.08 + rng.normal(0, 0.01, N_IN), np.zeros(N_OOS)), [OOS_RULE])
    cv = study_crossval(study, Objective(), [OOS_RULE], CrossValConfig())
    assert cv is not None and cv.established is True

    tracker = _Tracker()
    publish_study(study, objective=Objective(), links=None, tracker=tracker, crossval=cv)
    assert f"Cross-validated: {cv.summary_line()}" in get_note(study)
    call = tracker.calls[-1]
    assert call["metrics"]["cv_score"] == pytest.approx(cv.cv_score)
    assert call["metrics"]["cv_gain_ci_low"] > 0 and call["metrics"]["cv_gain_established"] == 1.0
    assert call["metrics"]["cv_optimism"] == pytest.approx(cv.optimism)
    assert call["tags"]["tuner.cv_verdict"] == cv.verdict
    line = cv.selection_line()  # both pick rules, one line each place
    assert line is not None and set(cv.rules) == {"best", "robust"}
    assert f"{line[0].upper()}{line[1:]}." in get_note(study)
    assert call["metrics"]["cv_score_robust"] == pytest.approx(cv.rules["robust"])


def test_candidates_carry_their_params_for_the_robust_pick() -> None:
    """A trial's params are its recorded assignment (nested values flattened); a replayed
    setting's are its own over its trial's, or a marker of its own when it has none."""
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(4)
    frame = _per_query(rng.uniform(0.2, 0.5, N_IN), np.zeros(N_OOS))
    trial = study.ask()
    metrics = _metrics(frame)
    trial.set_constraint(OOS_RULE.name, OOS_RULE.violation(metrics))
    assignment = {"fusion.method": "linear", "fusion.normalization": "minmax", "windows": [30, 90]}
    assignment["fusion.weights"] = {"bm25": 0.4, "dense": 0.6}
    set_record(trial, ATTR_ASSIGNMENT, assignment)
    record = build_record(frame, metrics, "Primary_Metric_Score", [OOS_RULE])
    assert record is not None
    setting = {
        "violation": -0.1,
        "objective": frame["Primary_Metric_Score"].to_numpy()[:N_IN],
        "oos_answered": "0" * N_OOS,
    }
    record["settings"] = settings_record(
        [
            {
                **setting,
                "setting": "w=0.4/0.6",
                "params": {"fusion.method": "linear", "fusion.normalization": "minmax"},
            },
            {
                **setting,
                "setting": "rrf 0.7/0.3",
                "params": {"fusion.method": "rrf", "fusion.weights": {"bm25": 0.7, "dense": 0.3}},
            },
            {**setting, "setting": "fusion.weights=0.2/0.8"},  # recorded before settings kept their params
        ]
    )
    save_record(trial, record, queries_of(frame), set())
    study.tell(trial, metrics["Primary_Metric_Score"])

    scores = study_scores(study, "Primary_Metric_Score", [OOS_RULE])
    assert scores is not None
    own, _, replayed, bare = scores.candidates
    windows = {"windows.0": 30, "windows.1": 90}  # a list of numbers stays numeric
    weights = {"fusion.weights.bm25": 0.4, "fusion.weights.dense": 0.6}
    assert own.params == {"fusion.method": "linear", "fusion.normalization": "minmax", **weights, **windows}
    # the rrf setting: no linear normalization stuck to it from its trial's own method
    assert replayed.params == {
        "fusion.method": "rrf",
        "fusion.weights.bm25": 0.7,
        "fusion.weights.dense": 0.3,
        **windows,
    }
    assert bare.params["replayed setting"] == bare.label and "fusion.method" not in bare.params


def test_selection_robust_chooses_the_trial_to_apply() -> None:
    """`tuner apply` without --trial (pick_trial): the best feasible trial, or with
    ``selection: robust`` the trial whose neighbourhood of like settings scores best; an
    infeasible trial is never chosen."""
    from tuner.study.feasibility import pick_trial
    from tuner.study.query_scores import robust_trial, trial_chooser

    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(5)
    base = rng.uniform(0.2, 0.5, N_IN)
    quiet, loud = np.zeros(N_OOS), np.ones(N_OOS)
    planted = [(0.0, 0.10, quiet), (0.02, -0.05, quiet), (0.04, -0.05, quiet), (0.06, -0.05, quiet)]
    planted += [(0.5, 0.30, loud)]  # the highest, but breaks the OOS budget
    planted += [(0.80 + 0.02 * i, 0.08, quiet) for i in range(5)]  # the plateau
    for x, gain, answered in planted:
        trial = study.ask()
        frame = _per_query(base + gain, answered)
        metrics = _metrics(frame)
        trial.set_constraint(OOS_RULE.name, OOS_RULE.violation(metrics))
        set_record(trial, ATTR_ASSIGNMENT, {"fusion.method": "rrf", "fusion.rrf_k": x})
        record = build_record(frame, metrics, "Primary_Metric_Score", [OOS_RULE])
        assert record is not None
        save_record(trial, record, queries_of(frame), set())
        study.tell(trial, metrics["Primary_Metric_Score"])

    assert pick_trial(study, None, maximize=True, choose=trial_chooser(Objective(), [OOS_RULE], "best")).number == 0
    robust = robust_trial(study, Objective(), [OOS_RULE])
    assert robust is not None and robust.number in range(5, 10)
    chosen = pick_trial(study, None, maximize=True, choose=trial_chooser(Objective(), [OOS_RULE], "robust"))
    assert chosen.number == robust.number
    assert pick_trial(study, 1, maximize=True, choose=trial_chooser(Objective(), [OOS_RULE], "robust")).number == 1
