"""The study report of a query set without out-of-scope queries (issue 26, item 3): its
OOS rates read ``n/a``, not a 0.0000 nothing measured."""

from __future__ import annotations

from optuna.trial import TrialState, create_trial

from tuner.ops import analysis
from tuner.study.trial.attrs import record_key


def _trial(number: int, score: float, n_oos: int, variant: str = ""):
    metrics = {"Primary_Metric_Score": score, "OOS_FP_Rate": 0.0, "N_OOS_Queries": float(n_oos)}
    t = create_trial(state=TrialState.COMPLETE, value=score, user_attrs={"variant": variant},
                     system_attrs={record_key("metrics"): metrics})
    t.number = number
    return t


def _markdown(n_oos: int) -> str:
    frame = analysis.trials_frame([_trial(0, 0.26, n_oos, "baseline"), _trial(1, 0.27, n_oos)])
    return analysis.study_markdown(frame, study_name="s", objective="Primary_Metric_Score", maximize=True,
                                   importances={})


def test_study_report_prints_n_a_for_oos_rates_without_oos_queries():
    text = _markdown(0)
    assert "| OOS_FP_Rate | n/a | n/a | n/a |" in text  # baseline vs best
    assert "| 1 | 0.2700 | n/a |" in text  # the feasible trials' table
    measured = _markdown(20)
    assert "| OOS_FP_Rate | 0.0000 | 0.0000 | 0.0000 |" in measured and "n/a" not in measured
