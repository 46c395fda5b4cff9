"""Tables, deltas and report files over trials (pure functions of a trials frame)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from tuner.cli.progress import eta_seconds, fmt_duration
from tuner.ops import analysis
from tuner.study.trial.attrs import record_key

LIMIT = 0.10


def trial(number: int, score: float | None, oos: float | None, *, state=TrialState.COMPLETE, variant: str = "",
          method: str = "rrf", fail: str | None = None, legacy: bool = False) -> optuna.trial.FrozenTrial:
    """A trial as the runner records it: the JSON records (assignment, metrics) as
    ``tuner.*`` system attrs, scalars as user attrs; ``legacy``: a study written before
    the split, its records kept as user attrs."""
    records = {"assignment": {"fusion.method": method, "fusion.weights": {"bm25": 0.25, "dense": 0.75},
                              "fallback.windows_days": [30, 90]}}
    attrs: dict = {"variant": variant}
    system: dict = {}
    if state == TrialState.COMPLETE:
        records["metrics"] = {"Primary_Metric_Score": score, "OOS_FP_Rate": oos, "NDCG@20": score / 2}
        system = {"constraints:OOS_FP_Rate <= 0.1": oos - LIMIT, "constraints": [oos - LIMIT]}
        attrs.update({"feasible": oos <= LIMIT, "OOS_FP_Rate": oos})
    if legacy:
        attrs.update(records)
    else:
        system.update({record_key(name): value for name, value in records.items()})
    if fail:
        attrs["fail_reason"] = fail
    t = create_trial(
        state=state,
        value=score if state == TrialState.COMPLETE else None,
        params={"fusion.method": method, "x": 0.5},
        distributions={"fusion.method": CategoricalDistribution(["rrf", "linear"]), "x": FloatDistribution(0, 1)},
        user_attrs=attrs,
        system_attrs=system,
    )
    t.number = number
    return t


@pytest.fixture(params=["records", "legacy user attrs"])
def frame(request):
    legacy = request.param == "legacy user attrs"
    return analysis.trials_frame([
        trial(0, 0.40, 0.20, variant="baseline", legacy=legacy),      # infeasible baseline
        trial(1, 0.55, 0.30, legacy=legacy),                          # best score, infeasible
        trial(2, 0.45, 0.05, method="linear", legacy=legacy),         # best feasible
        trial(3, 0.30, 0.00, legacy=legacy),                          # feasible
        trial(4, None, None, state=TrialState.FAIL, fail="HealthTimeout: x", legacy=legacy),
    ])


def test_feasible_ranking_excludes_infeasible_and_failed(frame) -> None:
    ranked = analysis.feasible_ranked(frame)
    assert list(ranked["number"]) == [2, 3]
    assert list(analysis.feasible_ranked(frame, maximize=False)["number"]) == [3, 2]
    best = analysis.best_feasible(frame)
    assert int(best["number"]) == 2
    infeasible = analysis.infeasible_trials(frame)
    assert list(infeasible["number"]) == [0, 1]  # least violating first: 0.10 < 0.20
    assert list(infeasible["violation"]) == pytest.approx([0.20 - LIMIT, 0.30 - LIMIT])


def test_the_legacy_positional_copy_is_not_a_second_constraint(frame) -> None:
    constraint_cols = [c for c in frame.columns if c.startswith(analysis.CONSTRAINT_PREFIX)]
    assert constraint_cols == ["constraint:OOS_FP_Rate <= 0.1"]


def test_deltas_are_best_minus_baseline(frame) -> None:
    best, base = analysis.best_feasible(frame), analysis.baseline_row(frame)
    got = {d.metric: d for d in analysis.deltas(best, base)}
    assert set(got) == {"NDCG@20", "Primary_Metric_Score", "OOS_FP_Rate"}
    assert got["Primary_Metric_Score"].change == pytest.approx(0.45 - 0.40)
    assert got["OOS_FP_Rate"].change == pytest.approx(0.05 - 0.20)
    assert got["NDCG@20"].change == pytest.approx(0.45 / 2 - 0.40 / 2)


def test_assignment_is_flattened_into_param_columns(frame) -> None:
    row = frame.iloc[2]
    assert row["param:fusion.weights.bm25"] == 0.25 and row["param:fusion.weights.dense"] == 0.75
    # a list's items under their positions, as the dashboards' and MLflow's params name them
    # (tuner.config.flatten): one name per value wherever a user reads it
    assert row["param:fallback.windows_days.0"] == 30 and row["param:fallback.windows_days.1"] == 90
    assert "param:fallback.windows_days" not in frame.columns
    assert row["param:fusion.method"] == "linear"
    assert frame.iloc[4]["fail_reason"] == "HealthTimeout: x" and not frame.iloc[4]["feasible"]


def test_empty_study_frame_and_require_trials() -> None:
    from tuner.errors import StudyError

    empty = analysis.trials_frame([])
    assert analysis.best_feasible(empty) is None and analysis.baseline_row(empty) is None
    with pytest.raises(StudyError, match="has no trials yet; run `tuner run EXPERIMENT` first"):
        analysis.require_trials(empty, "s")


def test_markdown_table_escapes_pipes() -> None:
    import pandas as pd

    text = analysis.markdown_table(pd.DataFrame([{"a": "x|y", "b": 0.123456, "c": math.nan}]))
    assert text.splitlines() == ["| a | b | c |", "| --- | --- | --- |", "| x\\|y | 0.1235 |  |"]


def test_study_report_files(frame, tmp_path: Path) -> None:
    paths = analysis.write_study_report(frame, tmp_path, study_name="s", objective="Primary_Metric_Score", maximize=True,
                                 importances={"x": 0.7, "fusion.method": 0.3}, oos_limit=LIMIT)
    import pandas as pd

    back = pd.read_csv(paths.csv)
    assert list(back["number"]) == [0, 1, 2, 3, 4] and list(back["state"])[-1] == "FAIL"
    md = paths.markdown.read_text()
    assert "**Best feasible trial: #2** (Primary_Metric_Score = 0.4500)" in md
    assert "Against the baseline (trial #0)" in md and "| OOS_FP_Rate (higher is worse) | 0.2000 | 0.0500 | -0.1500 |" in md
    for png in (paths.history_png, paths.importance_png, paths.score_vs_oos_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


def test_param_importances_on_a_real_study() -> None:
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    assert analysis.param_importances(study) == {}
    study.optimize(lambda t: 10 * t.suggest_float("big", 0, 1) + 0.01 * t.suggest_float("small", 0, 1), n_trials=30)
    imp = analysis.param_importances(study)
    assert list(imp) == ["big", "small"] and imp["big"] > 0.9


def test_importances_wait_for_enough_complete_trials_and_the_report_says_why() -> None:
    # below the floor fANOVA ranks noise: on 3-8 trials an unused key often came first
    # (tuner.ops.analysis.MIN_IMPORTANCE_TRIALS); a failed trial does not count
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(t: optuna.Trial) -> float:
        return 10 * t.suggest_float("big", 0, 1) + 0.01 * t.suggest_float("small", 0, 1)

    study.optimize(objective, n_trials=analysis.MIN_IMPORTANCE_TRIALS - 1)
    study.tell(study.ask(), state=TrialState.FAIL)
    assert analysis.param_importances(study) == {}
    frame = analysis.trials_frame(study.get_trials())
    md = analysis.study_markdown(frame, study_name="s", objective="value", maximize=True, importances={})
    assert (f"Not computed: fANOVA needs at least {analysis.MIN_IMPORTANCE_TRIALS} complete trials in which the "
            f"parameters vary (this study has {analysis.MIN_IMPORTANCE_TRIALS - 1} complete)") in md
    study.optimize(objective, n_trials=1)
    imp = analysis.param_importances(study)  # computed now; ranked right only further on (the test above)
    assert set(imp) == {"big", "small"}
    md = analysis.study_markdown(analysis.trials_frame(study.get_trials()), study_name="s", objective="value",
                                 maximize=True, importances=imp)
    assert "Not computed" not in md and "| big |" in md


def test_eta_and_durations() -> None:
    assert eta_seconds(4, 10, 40.0, None) == pytest.approx(40.0 / 4 * 6)
    assert eta_seconds(4, 10, 40.0, 50.0) == pytest.approx(10.0)  # the timeout comes first
    assert eta_seconds(0, 10, 0.0, None) is None
    assert fmt_duration(3725) == "1h02m" and fmt_duration(65) == "1m05s" and fmt_duration(None) == "?"


def test_the_summary_leads_with_the_objectives_own_metric(frame) -> None:
    """Tuned on NDCG@10 (not in the fixed scorecard list): the run summary's and the study
    report's baseline-vs-best tables show it, first (issue 26, item 5)."""
    from rich.console import Console

    from tuner.cli.progress import summary_tables

    frame = frame.copy()
    frame["NDCG@10"] = [0.31, 0.5, 0.42, 0.2, math.nan]
    best, base = analysis.best_feasible(frame), analysis.baseline_row(frame)
    got = analysis.deltas(best, base, objective="NDCG@10")
    assert got[0].metric == "NDCG@10" and got[0].change == pytest.approx(0.42 - 0.31)
    assert [d.metric for d in analysis.deltas(best, base, objective="NDCG@20")].count("NDCG@20") == 1
    console = Console(width=120, record=True)
    for table in summary_tables(frame, objective="NDCG@10", maximize=True):
        console.print(table)
    rows = [line for line in console.export_text().splitlines() if "NDCG@10" in line]
    assert rows and "0.3100" in rows[0] and "0.4200" in rows[0] and "+0.1100" in rows[0]
    md = analysis.study_markdown(frame, study_name="s", objective="NDCG@10", maximize=True, importances={})
    assert "| NDCG@10 | 0.3100 | 0.4200 | +0.1100 |" in md


def _trials_on_few_spots() -> list[optuna.trial.FrozenTrial]:
    """Twelve feasible trials on a few OOS rates with close scores: the labels of the
    score-vs-OOS plot crowd each other there (the demo's 0.0625 column)."""
    rates = [0.0625, 0.0625, 0.0625, 0.09375, 0.09375, 0.03125, 0.0625, 0.0625, 0.09375, 0.0625, 0.03125, 0.0625]
    scores = [0.3859, 0.3845, 0.3767, 0.3769, 0.3435, 0.2783, 0.3715, 0.3859, 0.2864, 0.3850, 0.2790, 0.3700]
    return [trial(n, s, r) for n, (s, r) in enumerate(zip(scores, rates, strict=True))]


def test_the_score_vs_oos_labels_do_not_overlap_and_each_trial_is_named_once() -> None:
    import matplotlib.pyplot as plt

    frame = analysis.trials_frame(_trials_on_few_spots())
    fig = analysis.score_vs_oos_figure(frame, objective="Primary_Metric_Score", oos_metric="OOS_FP_Rate",
                                       oos_limit=LIMIT)
    try:
        ax = fig.axes[0]
        labels = [t for t in ax.texts if t.get_text()[:1].isdigit()]
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])] == []
        named = sorted(int(n) for t in labels for n in t.get_text().split(", "))
        assert named == list(range(12))  # every feasible trial, once; 0 and 7 share one spot and one label
        assert any(t.get_text() == "0, 7" for t in labels)
        assert f"OOS_FP_Rate limit {LIMIT}" in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)


def test_the_history_plot_ticks_whole_trials() -> None:
    import matplotlib.pyplot as plt

    frame = analysis.trials_frame(_trials_on_few_spots()[:5])
    fig = analysis.history_figure(frame, objective="Primary_Metric_Score", maximize=True)
    try:
        fig.canvas.draw()
        ticks = fig.axes[0].get_xticks()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)
