"""A command imports what it uses, when it uses it: `tuner --help`, `tuner score` and
`tuner best` (its tables and its cross-validation without pandas) run in a fresh
interpreter, and the libraries loaded by the time each one exits are checked against
the heavy ones it has no use for (measured with `python -X importtime -m tuner ...`:
each costs from a tenth of a second to seconds of start-up on every call, `tuner
--help` included). A library that creeps back into a
module on these paths, at its top or in a package ``__init__``, fails here by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from support.reference_experiment import write_reference_experiment

from tuner.study.query_scores import QueryInfo, digest_of, save_record

# Run `python -m tuner ARGS` in this interpreter and write, at its exit, its exit code and
# every module it loaded (sys.modules sees imports made through importlib too, which
# -X importtime does not list).
PROBE = """
import json, runpy, sys
out, sys.argv = sys.argv[1], ["tuner", *sys.argv[2:]]
code = 0
try:
    runpy.run_module("tuner", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

# What no command needs before it has read its files.
HEAVY_EVERYWHERE = {"scipy", "mlflow", "optuna_dashboard", "matplotlib", "docker", "aiohttp", "httpx"}
# What a command needs only once it evaluates, scores or opens a study.
HEAVY_FOR_HELP = HEAVY_EVERYWHERE | {"pandas", "numpy", "pyarrow", "optuna", "sqlalchemy", "alembic", "pydantic"}


def loaded(tmp_path: Path, *args: str) -> set[str]:
    """The top-level packages `tuner ARGS` loaded (the command must succeed)."""
    return run_probe(tmp_path, *args)[0]


def run_probe(tmp_path: Path, *args: str) -> tuple[set[str], str]:
    """`loaded`, and what the command printed."""
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"}, timeout=300)
    assert done.returncode == 0, done.stderr
    probe = json.loads(out.read_text())
    assert probe["code"] in (0, None), done.stdout + done.stderr
    return {name.partition(".")[0] for name in probe["modules"]}, done.stdout


def test_help_loads_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    packages = loaded(tmp_path, "--help")
    assert {"tuner", "typer"} <= packages
    assert packages & HEAVY_FOR_HELP == set()


def test_score_loads_the_scorecard_and_nothing_of_studies_or_services(tmp_path: Path) -> None:
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 a 2\nq1 0 b 0\nq2 0 c 1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 b 2 1.0 t\nq2 Q0 d 1 3.0 t\n")
    packages = loaded(tmp_path, "score", "--qrels", str(qrels), "--run", str(run))
    assert {"numpy", "pandas"} <= packages  # the scorecard: the probe sees what a command imports late
    # (pydantic comes with typer, which coerces a command's arguments through it)
    assert packages & (HEAVY_EVERYWHERE | {"optuna", "sqlalchemy", "alembic"}) == set()


# Queries of the per-query records: two types, in scope and out of it (the folds are dealt by both).
QUERIES = [QueryInfo(f"q{i:02d}", "howto" if i % 2 else "lookup", "in") for i in range(20)]
QUERIES += [QueryInfo(f"o{i}", "oos", "oos") for i in range(6)]


def _tell_with_scores(study: optuna.Study, objective: list[float], oos_answered: str, *, variant: str = "") -> None:
    """A COMPLETE trial with its per-query record, as a run records it (tuner.study.query_scores)."""
    trial = study.ask()
    trial.set_user_attr("variant", variant)
    trial.set_constraint("OOS_FP_Rate <= 0.1", oos_answered.count("1") / len(oos_answered) - 0.1)
    record = {"q": digest_of(QUERIES), "objective": objective, "oos_answered": oos_answered}
    save_record(trial, record, QUERIES, set())
    study.tell(trial, sum(objective) / len(objective))


def test_best_reads_the_experiment_and_the_study_without_pandas_stats_tracking_or_plots(tmp_path: Path) -> None:
    """The tables are built from plain rows and the cross-validation runs on arrays: no pandas
    (nor pyarrow, which it brings), although the study has per-query records to cross-validate."""
    db = tmp_path / "optuna.db"
    study = optuna.create_study(study_name="light", storage=f"sqlite:///{db}", direction="maximize")
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, value=0.30, params={"fusion.method": "rrf"},
        distributions={"fusion.method": CategoricalDistribution(["rrf", "linear"])},
        user_attrs={"variant": "baseline"}))
    base = [round(0.2 + 0.01 * i, 5) for i in range(20)]
    _tell_with_scores(study, base, "000000", variant="baseline")
    _tell_with_scores(study, [round(v + 0.05 * (i % 3), 5) for i, v in enumerate(base)], "000000")
    _tell_with_scores(study, [round(v + 0.2, 5) for v in base], "110000")  # breaks the OOS constraint
    exp = write_reference_experiment(tmp_path, study="light", n_trials=4, storage=f"sqlite:///{db}",
                                     constraints=["OOS_FP_Rate <= 0.10"],
                                     holdout={"fraction": 0.3})  # the holdout section once pulled in scipy
    packages, out = run_probe(tmp_path, "best", str(exp))
    assert "infeasible trial(s)" in out and "cross-validated" in out and "gain over the baseline" in out
    assert {"optuna", "numpy", "pydantic"} <= packages
    assert packages & (HEAVY_EVERYWHERE | {"pandas", "pyarrow"}) == set()


# What `tuner run` / `tuner worker` load before their first trial, past the commands' own
# imports: their modules, and the MLflow tracker of an experiment that tracks nothing.
RUN_PROBE = """
import json, sys
from tuner.config.experiment import load_experiment
import tuner.ops.run, tuner.ops.workers
from tuner.study.wiring import make_tracker
tracker = make_tracker(load_experiment(sys.argv[1], check_paths=False), on_warning=print)
print(json.dumps([type(tracker).__name__, sorted({name.partition(".")[0] for name in sys.modules})]))
"""


def test_a_run_that_tracks_nothing_loads_no_mlflow_and_no_dashboard_app(tmp_path: Path) -> None:
    exp = write_reference_experiment(tmp_path, study="untracked", n_trials=1,
                                     storage=f"sqlite:///{tmp_path / 'optuna.db'}", tracking={"enabled": False})
    done = subprocess.run([sys.executable, "-c", RUN_PROBE, str(exp)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tracker, packages = json.loads(done.stdout.splitlines()[-1])
    assert tracker == "NullTracker"
    # notes load optuna-dashboard's note writer alone when a trial writes one (tests/study/test_dashboard_note.py)
    assert set(packages) & {"mlflow", "optuna_dashboard", "sklearn", "scipy", "matplotlib", "docker"} == set()
