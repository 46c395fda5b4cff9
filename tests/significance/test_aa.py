"""A/A check: tuning a parameter that cannot change results must not "win" on the holdout.

Each seed runs a real Optuna study over a parameter with no effect on the expected
per-query scores. Per-query scores still jitter from trial to trial (as with a
backend whose ties break nondeterministically), so the best tune-split trial looks
better than the baseline by selection alone. Re-testing it on the holdout must
declare a significant win in at most 5% of seeds; testing it on the tune split it
was selected on must not (that is the selection bias the holdout exists for).
"""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd

from tuner.data.dataset import Query
from tuner.evaluation.holdout import draw_split
from tuner.metrics.significance import compare

N_QUERIES, N_TRIALS, N_SEEDS, ALPHA = 80, 60, 60, 0.05


def _queries() -> list[Query]:
    kinds = ["short", "long", "date"]
    return [Query(f"q{i}", "t", kinds[i % 3], "s", "in") for i in range(N_QUERIES)]


def _scores(difficulty: np.ndarray, seed: int, trial: int, jitter: float) -> np.ndarray:
    rng = np.random.default_rng([seed, trial])
    return np.clip(difficulty + rng.normal(0.0, jitter, difficulty.size), 0.0, 1.0)


def _aa_seed(seed: int, jitter: float) -> tuple[bool, bool]:
    """(significant win on holdout, significant win on the tune split) for one seed."""
    queries = _queries()
    ids = [q.query_id for q in queries]
    split = draw_split(queries, fraction=0.4, seed=seed)
    pos = {qid: i for i, qid in enumerate(ids)}
    tune_idx = [pos[q] for q in split.tune]
    difficulty = np.random.default_rng(seed).uniform(0.1, 0.9, N_QUERIES)
    per_trial: dict[int, np.ndarray] = {}

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_float("irrelevant", 0.0, 1.0)  # cannot change any result
        per_trial[trial.number] = _scores(difficulty, seed, trial.number, jitter)
        return float(per_trial[trial.number][tune_idx].mean())

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial({"irrelevant": 0.5})  # trial 0 = the baseline
    study.optimize(objective, n_trials=N_TRIALS)
    best = study.best_trial.number
    frame = lambda t: pd.DataFrame({"Primary_Metric_Score": per_trial[t]}, index=ids)  # noqa: E731

    def wins(part: tuple[str, ...]) -> bool:
        row = compare(frame(0).loc[list(part)], frame(best).loc[list(part)], ["Primary_Metric_Score"],
                      n_resamples=2000, seed=seed).iloc[0]
        return bool(row.p_value < ALPHA and row.delta > 0)

    if best == 0:
        return False, False
    return wins(split.holdout), wins(split.tune)


def test_aa_study_wins_on_holdout_in_at_most_5_percent_of_seeds():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = [_aa_seed(seed, jitter=0.05) for seed in range(N_SEEDS)]
    holdout_rate = np.mean([h for h, _ in results])
    tune_rate = np.mean([t for _, t in results])
    assert holdout_rate <= 0.05, holdout_rate
    # The check is able to fail: on the queries the winner was picked on, the same
    # comparison "finds" a win far more often than the 5% a valid test allows (the best
    # of 59 noise draws sits ~2.3 sd up, so about a quarter of seeds pass p < 0.05).
    assert tune_rate >= 0.15, tune_rate


def test_aa_identical_results_never_win():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    assert not any(any(_aa_seed(seed, jitter=0.0)) for seed in range(5))
