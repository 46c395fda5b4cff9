"""Study and trial notes are written by optuna-dashboard's own ``save_note``, loaded without
the dashboard's web app (tuner.study.notes): the installed optuna-dashboard reads back
every note as written (long ones are split over several attributes), and writing them
loads neither the app nor scikit-learn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from tuner.study.notes import write_note
study = optuna.create_study(storage=sys.argv[1], study_name="notes", direction="maximize")
trial = study.ask()
write_note(study, "first")
write_note(study, "## the study\\n" + "long line " * 600)  # more than one attribute's 2,045 characters
write_note(trial, "trial **note**")
study.tell(trial, 0.5)
write_note(study, "## the study, final")
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules}
                        | {name for name in sys.modules if name.startswith("optuna_dashboard")})))
"""


def test_notes_are_read_back_by_the_dashboard_and_load_none_of_its_app(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'notes.db'}"
    done = subprocess.run([sys.executable, "-c", PROBE, storage], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert not loaded & {"optuna_dashboard", "optuna_dashboard._app", "sklearn", "bottle"}, loaded

    import optuna
    from optuna_dashboard import get_note

    study = optuna.load_study(study_name="notes", storage=storage)
    assert get_note(study) == "## the study, final"
    trial = study.trials[0]
    fixed = optuna.trial.Trial(study, trial._trial_id)
    assert get_note(fixed) == "trial **note**"


def test_a_long_note_round_trips(tmp_path: Path) -> None:
    import optuna
    from optuna_dashboard import get_note

    from tuner.study.notes import write_note

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'long.db'}", direction="maximize")
    body = "## the study\n" + "long line " * 600
    write_note(study, "short first")
    write_note(study, body)
    assert get_note(study) == body
