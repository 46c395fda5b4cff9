"""`tuner best` on a real Optuna SQLite study: the tables a person picks the winner from.

The study is written the way `tuner run` writes it (tuner/study/trial/runner.py): metrics and
assignment as ``tuner.*`` system attributes, variant / feasible / early_stop as user
attributes, each constraint through optuna 5's ``set_constraint`` plus the legacy
``constraints`` list optuna-dashboard reads. Expected numbers are read back from the
study, not written here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from support.reference_experiment import write_reference_experiment

from tuner.ops import analysis
from tuner.config.flatten import flatten
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_METRICS, assignment_of, metrics_of, record_key

LIMIT = 0.10
CONSTRAINT = "OOS_FP_Rate <= 0.1"
LONG_KEY = "retrieval.candidate_pool.max_documents_per_source"  # longer than any column at 80


def _assignment(i: int) -> dict[str, Any]:
    linear = i % 3 == 0
    out: dict[str, Any] = {
        "fusion.method": "linear" if linear else "rrf",
        "fusion.weights": {"bm25": round(0.3 + 0.031 * i, 4), "dense": round(0.7 - 0.031 * i, 4)},
        "confidence.threshold": round(0.25 + 0.01 * i, 2),
        "fallback.windows_days": [30 + i, 90 + 11 * i],
        "recency.half_life_days": 7 + 13 * i,
        LONG_KEY: 100 + i,
    }
    if linear:
        out["fusion.normalization"] = "minmax"
    else:
        out["fusion.rrf_k"] = 60 - i
    return out


def _trial(value: float, oos: float, *, variant: str = "", i: int = 0, early_stop: str = "",
           legacy: bool = False, oos_in_user_attr: bool = False) -> optuna.trial.FrozenTrial:
    """A COMPLETE trial as the trial runner records it (``legacy``: records as user attrs,
    as studies written before the split kept them)."""
    assignment = _assignment(i)
    metrics = {"Primary_Metric_Score": value, "Judged@10": round(0.8 + 0.003 * i, 4)}
    user: dict[str, Any] = {"variant": variant, "feasible": oos <= LIMIT}
    if oos_in_user_attr:
        user["OOS_FP_Rate"] = oos
    else:
        metrics["OOS_FP_Rate"] = oos
    if early_stop:
        user["early_stop"] = early_stop
    system: dict[str, Any] = {"constraints": [oos - LIMIT]}
    if legacy:
        user.update({ATTR_METRICS: metrics, ATTR_ASSIGNMENT: assignment})
    else:
        system.update({record_key(ATTR_METRICS): metrics, record_key(ATTR_ASSIGNMENT): assignment})
    return create_trial(
        state=TrialState.COMPLETE, value=value,
        params={"fusion.method": assignment["fusion.method"]},
        distributions={"fusion.method": CategoricalDistribution(["rrf", "linear"])},
        user_attrs=user, system_attrs=system, constraints={CONSTRAINT: oos - LIMIT},
    )


def _failed() -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "HealthTimeout: no answer in 60 s"})


def _project(tmp_path: Path, trials: list[optuna.trial.FrozenTrial]) -> tuple[Path, optuna.Study]:
    db = tmp_path / "optuna.db"
    study = optuna.create_study(study_name="picks", storage=f"sqlite:///{db}", direction="maximize")
    for t in trials:
        study.add_trial(t)
    exp = write_reference_experiment(tmp_path, study="picks", n_trials=len(trials), storage=f"sqlite:///{db}",
                                     objective={"metric": "Primary_Metric_Score", "direction": "maximize"},
                                     constraints=["OOS_FP_Rate <= 0.10"])
    return exp, study


def _best(exp: Path, *args: str, columns: int = 80) -> str:
    from typer.testing import CliRunner

    from tuner.cli import app

    done = CliRunner().invoke(app, ["best", str(exp), *args], env={"COLUMNS": str(columns)})
    assert done.exit_code == 0, done.output
    return done.output


def _rows_of(out: str, title: str) -> list[str]:
    """The body lines of the table titled ``title`` (rows start with "│")."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            return body
        if line.startswith("│"):
            body.append(line)
    raise AssertionError(f"table {title!r} does not end")


def _numbers(rows: list[str]) -> list[int]:
    """Trial numbers in the first column (wrapped continuation lines have none)."""
    return [int(m.group(1)) for m in (re.match(r"│\s+#(\d+) ", r) for r in rows) if m]


@pytest.fixture()
def study_with_everything(tmp_path: Path) -> tuple[Path, optuna.Study]:
    values = [0.41, 0.47, 0.35, 0.52, 0.44, 0.38, 0.50, 0.36, 0.46, 0.33, 0.49, 0.40, 0.43]
    trials = [_trial(0.37, 0.05, variant="baseline", i=0)]
    trials += [_trial(v, 0.0625 if n % 2 else 0.09375, i=n + 1, variant="shortlist-a" if n == 2 else "",
                      legacy=n == 4, oos_in_user_attr=n == 5)
               for n, v in enumerate(values)]
    trials += [_trial(0.61, 0.125, i=20),  # the best score, but breaks the constraint
               _trial(0.22, 0.20, i=21, early_stop="OOS budget exceeded (stopped after 12 queries)"),
               _failed()]
    return _project(tmp_path, trials)


def test_best_at_80_columns_shows_baseline_deltas_verdicts_and_every_key_whole(study_with_everything) -> None:
    exp, study = study_with_everything
    out = _best(exp, "--top", "10")
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    base = next(t for t in done if t.user_attrs["variant"] == "baseline")
    feasible = [t for t in done if all(v <= 0 for v in t.constraints.values()) and t is not base]
    top = sorted(feasible, key=lambda t: -t.values[0])[:10]

    assert all(len(line) <= 80 for line in out.splitlines()), "a line is wider than the terminal"
    # The trials table: the baseline first, then the top 10 feasible trials, best first.
    rows = _rows_of(out, "picks: the baseline and the top 10 feasible trial(s)")
    assert _numbers(rows) == [base.number] + [t.number for t in top]
    assert "baseline" in rows[0] and "—" in rows[0]
    oos = {t.number: (metrics_of(t).get("OOS_FP_Rate", t.user_attrs.get("OOS_FP_Rate"))) for t in done}
    assert f"{oos[base.number]:.4f} ✓ ≤ 0.10" in rows[0]
    for t, row in zip(top, [r for r in rows[1:] if re.match(r"│\s+#\d+ ", r)]):
        assert f"{t.values[0] - base.values[0]:+.4f}" in row  # Δ vs the baseline, signed
        assert f"{oos[t.number]:.4f} ✓ ≤ 0.10" in row  # the legacy-record and user-attr trials too
        assert f"{metrics_of(t)['Judged@10']:.4f}" in row
    # Infeasible trials apart: which constraint, by how much; the early stop said so.
    over = next(t for t in done if t.constraints[CONSTRAINT] > 0 and "early_stop" not in t.user_attrs)
    stopped = next(t for t in done if "early_stop" in t.user_attrs)
    bad = _rows_of(out, "2 infeasible trial(s)")
    assert _numbers(bad) == [over.number, stopped.number]  # least violating first
    assert "0.1250 ✗ > 0.10 by 0.0250" in bad[0]
    assert "≥0.2000 ✗ > 0.10 by ≥0.1000" in bad[1] and "stopped early" in bad[1]
    assert f"#{stopped.number} stopped early: OOS budget exceeded (stopped after 12 queries)" in out
    assert "1 trial(s) failed or pruned" in out
    # No signed violation anywhere (feasible ones are negative in the study).
    assert "violation" not in out
    for t in done:
        v = t.constraints[CONSTRAINT]
        if v < 0:
            assert f"{v:.4f}" not in out, f"trial {t.number}'s violation {v:.4f} printed"
    # Every config key whole, each listed trial's values present, changes marked.
    shown = [base] + top
    keys = set().union(*(flatten(assignment_of(t)) for t in shown))
    assert LONG_KEY in keys and "fusion.weights.bm25" in keys
    for key in keys:
        assert re.search(rf"│ {re.escape(key)} +│", out), f"config key {key} cut or missing"
    header_numbers = re.findall(r"#(\d+)", "\n".join(line for line in out.splitlines() if line.startswith("┃")))
    assert {t.number for t in shown} <= {int(n) for n in header_numbers}
    # a list item by item under its position (tuner.config.flatten: the names the dashboards
    # and MLflow show), each marked as changed from the baseline's
    windows = zip(assignment_of(base)["fallback.windows_days"], assignment_of(top[0])["fallback.windows_days"])
    for pos, (was, days) in enumerate(windows):
        assert re.search(rf"│ fallback\.windows_days\.{pos} +│ +{was} │ +{days}\* │", out), pos
    assert out.count("config values (") >= 2  # split over several tables rather than cut


def test_wide_terminal_fits_all_trials_in_one_parameters_table(study_with_everything) -> None:
    exp, _ = study_with_everything
    out = _best(exp, "--top", "3", columns=200)
    assert re.search(r"^config values\s*$", out, re.M)
    assert "config values (" not in out


def test_no_feasible_trial_is_one_line_and_the_baseline_still_shows(tmp_path: Path) -> None:
    exp, study = _project(tmp_path, [_trial(0.30, 0.15, variant="baseline"), _trial(0.35, 0.18, i=1)])
    out = _best(exp, columns=200)
    assert out.splitlines()[0] == ("no feasible trial yet: 2 complete trial(s), none meets every constraint "
                                   "(the baseline is shown below)")
    rows = _rows_of(out, "picks: the baseline and no feasible trial")
    assert _numbers(rows) == [0] and "baseline" in rows[0] and "0.1500 ✗ > 0.10" in rows[0]
    assert _numbers(_rows_of(out, "2 infeasible trial(s)")) == [0, 1]


def test_without_a_baseline_there_is_no_delta_column(tmp_path: Path) -> None:
    exp, _ = _project(tmp_path, [_trial(0.30, 0.05, i=1), _trial(0.35, 0.08, i=2)])
    out = _best(exp)
    assert "no baseline trial in this study" in out
    assert "Δ base" not in out and "*" not in out
    assert _numbers(_rows_of(out, "picks: the top 2 feasible trial(s)")) == [1, 0]


def test_report_tables_carry_verdicts_not_violations(study_with_everything) -> None:
    _, study = study_with_everything
    frame = analysis.trials_frame(study.get_trials())
    md = analysis.markdown_table(analysis.summary_table(analysis.infeasible_trials(frame)))
    assert "0.1250 ✗ > 0.10 by 0.0250" in md and "(violation)" not in md
    feasible_md = analysis.markdown_table(analysis.summary_table(analysis.feasible_ranked(frame)))
    assert "0.0500 ✓ ≤ 0.10" in feasible_md and "-0.0500" not in feasible_md


def test_selection_robust_names_the_trial_apply_deploys(tmp_path: Path) -> None:
    """Trials without per-query records: the robust pick falls back to the best feasible
    trial, and `tuner best` says which trial `tuner apply` applies."""
    trials = [_trial(0.37, 0.05, variant="baseline", i=0), _trial(0.52, 0.0625, i=1), _trial(0.61, 0.125, i=2)]
    exp, _ = _project(tmp_path, trials)
    exp.write_text(exp.read_text() + "selection: robust\n")
    out = _best(exp, columns=200)
    assert re.search(r"selection: robust: `tuner apply \S+` applies trial #1 \(Primary_Metric_Score 0\.5200\)", out)
    (tmp_path / "plain").mkdir()
    plain, _ = _project(tmp_path / "plain", trials)  # selection left out: best, no such line
    assert "selection: robust" not in _best(plain, columns=200)
