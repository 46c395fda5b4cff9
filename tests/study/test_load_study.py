"""`load_study`, which every command reading a study uses (best, apply, report, check):
a study a run made opens without schema creation or version check; a study that is not
there, in a database with or without Optuna's schema, is one StudyError that says to run
first; nothing the open does creates a study."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from tuner.errors import StudyError
from tuner.study.storage.study_storage import load_study


def experiment(db: Path, study: str = "s") -> Any:
    return SimpleNamespace(study=study, storage=f"sqlite:///{db}", source=Path("exp.yaml"))


def test_a_study_a_run_made_is_read_back(tmp_path: Path) -> None:
    db = tmp_path / "optuna.db"
    made = optuna.create_study(study_name="s", storage=f"sqlite:///{db}", direction="maximize")
    made.add_trial(optuna.trial.create_trial(value=0.5))
    study = load_study(experiment(db))
    assert [t.value for t in study.get_trials()] == [0.5]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE


@pytest.mark.parametrize("schema", [True, False], ids=["other-study", "empty-database"])
def test_a_study_not_there_says_run_first_and_creates_nothing(tmp_path: Path, schema: bool) -> None:
    db = tmp_path / "optuna.db"
    if schema:
        optuna.create_study(study_name="other", storage=f"sqlite:///{db}")
    with pytest.raises(StudyError, match=r"^no study 's' in sqlite:///.*optuna\.db; run `tuner run exp\.yaml` first$"):
        load_study(experiment(db))
    assert [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}")] == (["other"] if schema else [])
