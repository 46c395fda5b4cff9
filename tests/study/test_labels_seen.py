"""A study records the labels its trials are measured on; resumed on other labels it
stops (trials of two label sets are never ranked together), apply included."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from tuner.errors import LabelError
from tuner.study.storage.study_storage import ATTR_LABELS
from tuner.study.wiring import labels_mismatch, record_labels_seen

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _prepared(fingerprint: str) -> SimpleNamespace:
    exp = SimpleNamespace(study="s", source=Path("exp.yaml"))
    return SimpleNamespace(experiment=exp, labels_fingerprint=fingerprint, queries=SimpleNamespace(dataset_id="demo"))


def _measured(study: optuna.Study) -> None:
    study.add_trial(optuna.trial.create_trial(value=0.5))


def test_a_new_study_records_its_labels_and_a_resume_on_the_same_labels_goes_on() -> None:
    study = optuna.create_study(direction="maximize")
    assert record_labels_seen(study, _prepared("a" * 64)) is None
    assert study.user_attrs[ATTR_LABELS] == {"dataset_id": "demo", "fingerprint": "a" * 64}
    _measured(study)
    assert record_labels_seen(study, _prepared("a" * 64)) is None


def test_a_study_measured_on_other_labels_stops_with_one_line() -> None:
    study = optuna.create_study(direction="maximize")
    record_labels_seen(study, _prepared("a" * 64))
    _measured(study)
    with pytest.raises(LabelError) as err:
        record_labels_seen(study, _prepared("b" * 64))
    assert str(err.value) == (
        "study 's' has 1 trial(s) measured on other labels of dataset demo (fingerprint aaaaaaaaaaaa..., now "
        "bbbbbbbbbbbb...): their scores are not comparable with new trials; start a new study: give `study:` in "
        "exp.yaml a new name (the old study stays readable under its name), or put the old labels back")
    assert study.user_attrs[ATTR_LABELS]["fingerprint"] == "a" * 64  # unchanged: nothing mixed
    assert labels_mismatch(study, _prepared("b" * 64).experiment, "b" * 64) == str(err.value)  # what apply raises


def test_a_study_without_measured_trials_takes_the_new_labels() -> None:
    study = optuna.create_study(direction="maximize")
    record_labels_seen(study, _prepared("a" * 64))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    assert record_labels_seen(study, _prepared("b" * 64)) is None
    assert study.user_attrs[ATTR_LABELS]["fingerprint"] == "b" * 64


def test_a_study_from_before_the_record_is_adopted_with_a_note() -> None:
    study = optuna.create_study(direction="maximize")
    _measured(study)
    note = record_labels_seen(study, _prepared("c" * 64))
    assert note == ("study 's' has 1 trial(s) from before the labels were recorded: they are taken as measured on "
                    "the labels now (fingerprint cccccccccccc...)")
