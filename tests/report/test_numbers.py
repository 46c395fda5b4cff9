"""Numbers as a person reads them (tuner.numbers): the one format of notes, cards and
report tables, checked on the values the issue found printed raw, and in the notes a
study writes (tuner.study.notes)."""

from __future__ import annotations

import math

import pytest
from optuna.trial import TrialState, create_trial

from tuner.numbers import delta, num, rounded, value, worse
from tuner.study.notes import study_note, trial_note


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (0.30000000000000004, "0.3000"),
        (0.853448275862069, "0.8534"),
        (0.09375, "0.0938"),  # next to 0.0625: four decimals both
        (0.0625, "0.0625"),
        (0.0, "0.0000"),
        (1.0671, "1.067"),  # four significant digits from 1 up
        (12.5, "12.50"),
        (1234.5, "1234"),
        (3e-6, "3.000e-06"),  # four decimals would read 0
        (7, "7"),
        (math.nan, "n/a"),
        (None, "n/a"),
        (True, "n/a"),
    ],
)
def test_a_measured_value_has_four_digits_that_count(raw: object, shown: str) -> None:
    assert num(raw) == shown


def test_changes_are_signed_and_config_values_are_short() -> None:
    assert [delta(0.1076), delta(-0.003), delta(0.0)] == ["+0.1076", "-0.0030", "+0.0000"]
    assert value([30, 90]) == value((30, 90)) == "[30, 90]"  # one list format for windows
    assert [value(0.30000000000000004), value(0.5419185503067607), value(60), value("rrf")] == [
        "0.3", "0.5419", "60", "rrf"]
    assert rounded(0.853448275862069) == 0.8534 and rounded(0.09375) == 0.0938 and math.isnan(rounded(math.nan))
    assert worse("<=") == "higher is worse" and worse(">=") == "lower is worse"


def test_the_trial_note_reads_like_a_person_wrote_it() -> None:
    note = trial_note(number=3, state="COMPLETE", value=0.30000000000000004, objective="score", feasible=False,
                      constraints={"OOS_FP_Rate <= 0.1": 0.15000000000000002}, metrics={"OOS_FP_Rate": 0.25},
                      solved={"confidence.threshold": 0.38000000000000006})
    assert "**score 0.3000** · **infeasible**" in note
    assert ("- `OOS_FP_Rate <= 0.1`: OOS_FP_Rate = 0.2500, **violated** by +0.1500 "
            "(OOS_FP_Rate at most 0.1; higher is worse)") in note
    assert "- `confidence.threshold` = 0.38 (solved from this trial's retrieval)" in note
    assert "0000000" not in note


def test_the_study_note_signs_its_deltas_and_says_which_way_is_worse() -> None:
    def done(number: int, value: float, rate: float, variant: str = "") -> object:
        t = create_trial(state=TrialState.COMPLETE, value=value, constraints={"OOS_FP_Rate <= 0.1": rate - 0.1},
                         user_attrs={"variant": variant, "OOS_FP_Rate": rate})
        t.number = number
        return t

    trials = [done(0, 0.2783, 0.03125, "baseline"), done(1, 0.30000000000000004, 0.09375), done(2, 0.2500, 0.0625)]
    note = study_note(trials, study_name="s", objective="score", maximize=True)
    assert "**Best feasible: trial #1, score 0.3000** (+0.0217 vs the baseline #0, 0.2783)." in note
    assert "| #1 | 0.3000 | +0.0217 | OOS_FP_Rate 0.0938 |  |" in note
    assert "| #2 | 0.2500 | -0.0283 | OOS_FP_Rate 0.0625 |  |" in note
    assert "Constraints: OOS_FP_Rate at most 0.1; higher is worse." in note
