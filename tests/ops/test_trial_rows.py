"""tuner.ops.trial_rows: the plain rows `tuner best` prints from select exactly what the
report's trials frame (tuner.ops.analysis, built from the same rows) selects: the feasible
trials best first, the infeasible ones least violating first, the baseline, the columns in
the same order and the same values, a frame's NaN being a key the row lacks."""

from __future__ import annotations

import math
import random
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from tuner.errors import StudyError
from tuner.ops import analysis, trial_rows
from tuner.study.trial.attrs import record_key

LIMITS = {"OOS_FP_Rate <= 0.1": 0.1, "Latency_P95_ms <= 50": 50.0}


def _trial(number: int, rng: random.Random) -> optuna.trial.FrozenTrial:
    """A trial as the runner records it, with ties in value, conditional keys, constraints
    that hold or break (equally, too), and now and then a failed trial or a second baseline."""
    state = TrialState.FAIL if rng.random() < 0.15 else TrialState.COMPLETE
    assignment: dict[str, Any] = {"fusion.method": rng.choice(["rrf", "linear"])}
    if assignment["fusion.method"] == "rrf":
        assignment["fusion.rrf_k"] = rng.choice([10, 60])  # only some trials have it: a frame's gap
    else:
        assignment["fusion.weights"] = {"bm25": 0.25, "dense": 0.75}
    user: dict[str, Any] = {"variant": "baseline" if number in (2, 5) else rng.choice(["", "", "shortlist-a"])}
    system: dict[str, Any] = {record_key("assignment"): assignment}
    constraints: dict[str, float] = {}
    value = None
    if state == TrialState.COMPLETE:
        value = rng.choice([0.3, 0.4, 0.45, 0.5])  # few values: ties go to the lower number
        metrics = {"Primary_Metric_Score": value, "OOS_FP_Rate": rng.choice([0.0, 0.05, 0.2])}
        if rng.random() < 0.5:  # only some trials carry the second constraint
            metrics["Latency_P95_ms"] = rng.choice([20.0, 80.0])
        for name, limit in LIMITS.items():
            metric = name.split()[0]
            if metric in metrics:
                constraints[name] = metrics[metric] - limit
        system[record_key("metrics")] = metrics
        if rng.random() < 0.2:
            user["early_stop"] = "OOS budget exceeded"
    t = create_trial(
        state=state, value=value, params={"fusion.method": assignment["fusion.method"]},
        distributions={"fusion.method": CategoricalDistribution(["rrf", "linear"])},
        user_attrs=user, system_attrs=system, constraints=constraints or None,
    )
    t.number = number
    return t


def _same(a: Any, b: Any) -> bool:
    missing_a = a is None or (isinstance(a, float) and math.isnan(a))
    missing_b = b is None or (isinstance(b, float) and math.isnan(b))
    return missing_a == missing_b and (missing_a or a == b)


def test_rows_select_what_the_frame_selects() -> None:
    for seed in range(12):
        rng = random.Random(seed)
        trials = [_trial(n, rng) for n in range(25)]
        rng.shuffle(trials)  # the storage's order is not the numbers' order
        frame = analysis.trials_frame(trials)
        table = trial_rows.trial_rows(trials)
        rows = table.rows

        assert table.columns == list(frame.columns)
        assert [r["number"] for r in rows] == frame["number"].tolist()
        for row, (_, series) in zip(rows, frame.iterrows(), strict=True):
            assert all(_same(row.get(c), series[c]) for c in frame.columns), seed
        for maximize in (True, False):
            ranked = [r["number"] for r in trial_rows.feasible_ranked(rows, maximize=maximize)]
            assert ranked == analysis.feasible_ranked(frame, maximize=maximize)["number"].tolist()
        infeasible = [r["number"] for r in trial_rows.infeasible(rows)]
        assert infeasible == analysis.infeasible_trials(frame)["number"].tolist()
        assert infeasible, seed  # every seed plants some: the order is really compared
        base = trial_rows.baseline(rows)
        frame_base = analysis.baseline_row(frame)
        assert (base is None) == (frame_base is None)
        assert base is None or frame_base is None or base["number"] == frame_base["number"]


def test_no_trials_is_one_line_whichever_the_container() -> None:
    for empty in (trial_rows.trial_rows([]).rows, analysis.trials_frame([])):
        with pytest.raises(StudyError, match=r"study 'x' has no trials yet; run `tuner run EXPERIMENT` first"):
            trial_rows.require_trials(empty, "x")
