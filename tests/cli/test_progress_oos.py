"""The run display without out-of-scope queries or without constraints (issue 26, item 3):
trial lines and the run summary print ``n/a``, never a ``0.000 feasible`` nothing measured."""

from __future__ import annotations

import io

from optuna.trial import TrialState, create_trial
from rich.console import Console

from tuner.cli.progress import summary_tables, trial_line
from tuner.ops import analysis
from tuner.study.trial.attrs import record_key
from tuner.study.trial.outcome import TrialOutcome


def _outcome(n_oos: int, oos: float, constraints: dict[str, float]) -> TrialOutcome:
    return TrialOutcome(1, "COMPLETE", 0.2299, metrics={"OOS_FP_Rate": oos, "N_OOS_Queries": float(n_oos)},
                        constraints=constraints, phase_seconds={"evaluate": 2.3})


def test_trial_line_prints_n_a_without_oos_queries_or_constraints():
    bound = {"OOS_FP_Rate <= 0.1": -0.1}
    assert trial_line(_outcome(20, 0.05, bound), "Primary_Metric_Score").plain == \
        "#1   score 0.2299  OOS FP 0.050  feasible    2.3s"
    # no out-of-scope queries, no constraint (the importer's experiment for such a set)
    line = trial_line(_outcome(0, 0.0, {}), "Primary_Metric_Score", constrained=False).plain
    assert line == "#1   score 0.2299  OOS FP n/a    n/a         2.3s"
    assert "0.000" not in line and "feasible" not in line
    # out-of-scope queries but no constraint: the rate is measured, feasibility means nothing
    assert trial_line(_outcome(20, 0.35, {}), "Primary_Metric_Score", constrained=False).plain == \
        "#1   score 0.2299  OOS FP 0.350  n/a         2.3s"


def _trial(number: int, score: float, n_oos: int, variant: str = ""):
    metrics = {"Primary_Metric_Score": score, "NDCG@20": score, "OOS_FP_Rate": 0.0, "N_OOS_Queries": float(n_oos)}
    t = create_trial(state=TrialState.COMPLETE, value=score, user_attrs={"variant": variant},
                     system_attrs={record_key("metrics"): metrics})
    t.number = number
    return t


def _printed(tables) -> str:
    console = Console(file=io.StringIO(), width=100)
    for table in tables:
        console.print(table)
    return console.file.getvalue()


def test_run_summary_prints_n_a_for_the_oos_rate_of_a_set_without_oos_queries():
    frame = analysis.trials_frame([_trial(0, 0.26, 0, "baseline"), _trial(1, 0.27, 0)])
    text = _printed(summary_tables(frame, objective="Primary_Metric_Score", maximize=True))
    row = next(line for line in text.splitlines() if "OOS_FP_Rate" in line)
    assert [c.strip() for c in row.split("│")[2:5]] == ["n/a", "n/a", "n/a"]
    assert "0.0000" not in row
    with_oos = analysis.trials_frame([_trial(0, 0.26, 20, "baseline"), _trial(1, 0.27, 20)])
    row = next(line for line in _printed(summary_tables(with_oos, objective="Primary_Metric_Score", maximize=True))
               .splitlines() if "OOS_FP_Rate" in line)
    assert [c.strip() for c in row.split("│")[2:5]] == ["0.0000", "0.0000", "+0.0000"]
