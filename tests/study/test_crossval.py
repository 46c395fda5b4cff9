"""tuner.study.crossval: the cross-validated estimate of "tune, then deploy the winner"."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.config.objective import Constraint
from tuner.evaluation.holdout import stratified_folds
from tuner.study.crossval import Candidate, QueryInfo, cross_validate

OOS_RULE = Constraint.parse("OOS_FP_Rate <= 0.1")
N_IN, N_OOS = 60, 10


def _queries(n_in: int = N_IN, n_oos: int = N_OOS) -> list[QueryInfo]:
    ins = [QueryInfo(f"q{i:03d}", "lookup" if i % 3 else "howto", "in") for i in range(n_in)]
    return ins + [QueryInfo(f"o{i:03d}", "oos", "oos") for i in range(n_oos)]


def _candidate(number: int, scores: np.ndarray, answered: np.ndarray | None = None, **kw: object) -> Candidate:
    """``scores`` over the in-scope queries, ``answered`` (0/1) over the OOS ones."""
    n_oos = N_OOS if answered is None else len(answered)
    answered = np.zeros(n_oos) if answered is None else answered
    objective = np.concatenate([scores, np.full(n_oos, np.nan)])
    oos = np.concatenate([np.full(len(scores), np.nan), answered.astype(float)])
    return Candidate(number, f"#{number}", objective, {"OOS_FP_Rate": oos}, **kw)  # type: ignore[arg-type]


def _base(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.2, 0.6, N_IN)


def _noise_study(seed: int, n_trials: int = 200) -> tuple[np.ndarray, list[Candidate]]:
    """Trials differing from the baseline (trial 0) only by per-query noise: a planted
    parameter with no effect on quality."""
    rng = np.random.default_rng(100 + seed)
    base_scores = _base(rng)
    noisy = [_candidate(n, base_scores + rng.normal(0, 0.05, N_IN)) for n in range(1, n_trials)]
    return base_scores, [_candidate(0, base_scores), *noisy]


def test_noise_only_trials_flatter_in_sample_but_not_cross_validated() -> None:
    """Over 12 such studies the in-sample best beats the baseline by a wide margin on
    average, the cross-validated gain averages 0 (its true value) and its interval holds 0
    in most studies (a 95% interval: at least 9 of 12)."""
    in_sample, cv_gain, covered = [], [], 0
    for seed in range(12):
        _, trials = _noise_study(seed)
        cv = cross_validate(_queries(), trials, trials[0], [OOS_RULE], seed=seed, n_resamples=2000)
        assert cv is not None and cv.in_sample_gain is not None and cv.gain is not None
        assert cv.ci_low is not None and cv.ci_high is not None and cv.optimism is not None
        in_sample.append(cv.in_sample_gain)
        cv_gain.append(cv.gain)
        covered += cv.ci_low <= 0.0 <= cv.ci_high
        assert cv.optimism == pytest.approx(cv.in_sample_gain - cv.gain)
    assert np.mean(in_sample) > 0.012  # the winner of 200 noisy draws looks like a gain
    assert abs(np.mean(cv_gain)) < 0.006  # the cross-validated estimate does not
    assert np.mean(in_sample) - np.mean(cv_gain) > 0.01  # optimism
    assert covered >= 9


def test_noise_only_study_says_the_gain_is_not_established() -> None:
    _, trials = _noise_study(1)
    cv = cross_validate(_queries(), trials, trials[0], [OOS_RULE], seed=1, n_resamples=2000)
    assert cv is not None and cv.ci_low is not None and cv.ci_high is not None
    assert cv.ci_low <= 0.0 <= cv.ci_high and cv.established is False
    assert cv.in_sample_gain is not None and cv.in_sample_gain > cv.ci_high  # in-sample: outside the CV interval
    assert "no evidence the winner beats the baseline on new queries" in cv.summary_line().lower()
    assert "no evidence the winner beats the baseline on new queries" in cv.to_markdown().lower()


def test_a_real_gain_survives_cross_validation() -> None:
    rng = np.random.default_rng(11)
    base_scores = _base(rng)
    baseline = _candidate(0, base_scores)
    noise = [_candidate(n, base_scores + rng.normal(0, 0.05, N_IN)) for n in range(1, 40)]
    better = [_candidate(n, base_scores + 0.06 + rng.normal(0, 0.02, N_IN)) for n in range(40, 60)]

    cv = cross_validate(_queries(), [baseline, *noise, *better], baseline, [OOS_RULE], seed=0)

    assert cv is not None and cv.ci_low is not None
    assert cv.ci_low > 0 and cv.established is True
    assert all(p.label is not None and int(p.label[1:]) >= 40 for p in cv.picks)  # every fold finds the real gain
    assert cv.gain == pytest.approx(cv.cv_score - base_scores.mean())
    assert "holds on queries the selection did not see" in cv.summary_line().lower()


def test_the_cv_score_is_each_fold_pick_on_its_held_out_queries() -> None:
    """With one candidate the deployed scores are its own: CV = in-sample, optimism 0."""
    rng = np.random.default_rng(1)
    scores = _base(rng)
    only = _candidate(5, scores)
    cv = cross_validate(_queries(), [only], None, [OOS_RULE])
    assert cv is not None
    assert cv.cv_score == pytest.approx(scores.mean())
    assert cv.optimism == pytest.approx(0.0)
    assert cv.gain is None and cv.established is None
    assert sum(p.n_heldout for p in cv.picks) == N_IN
    assert cv.folds == 5 and cv.n_queries == N_IN


def test_constraints_hold_per_fold_on_the_training_queries() -> None:
    """A higher-scoring candidate answers 2 of 10 OOS queries (0.2 > 0.1: infeasible on all
    queries), both in one fold: it is feasible only where that fold is held out, so it is
    that fold's pick and no other's."""
    queries = _queries()
    folds = stratified_folds(queries, 5, seed=0)
    oos_ids = [q.query_id for q in queries if q.scope == "oos"]
    in_fold0 = [q for q in oos_ids if folds[q] == 0]
    assert len(in_fold0) == 2  # stratified: 10 OOS queries, 2 per fold
    answered = np.array([1.0 if q in in_fold0 else 0.0 for q in oos_ids])
    rng = np.random.default_rng(2)
    base_scores = _base(rng)
    safe = _candidate(1, base_scores + 0.01)
    leaky = _candidate(2, base_scores + 0.05, answered)

    cv = cross_validate(queries, [safe, leaky], _candidate(0, base_scores), [OOS_RULE], seed=0)

    assert cv is not None
    assert [p.label for p in cv.picks] == ["#2", "#1", "#1", "#1", "#1"]
    assert cv.in_sample_label == "#1"  # on all queries the leaky one breaks the constraint
    assert cv.heldout_constraints["OOS_FP_Rate"] == pytest.approx(0.2)  # what the picks did on new OOS queries


def test_a_constraint_without_per_query_values_keeps_the_trials_whole_set_verdict() -> None:
    latency = Constraint.parse("Latency_P95_ms <= 100")
    rng = np.random.default_rng(4)
    base_scores = _base(rng)
    slow = _candidate(1, base_scores + 0.1, fixed={latency.name: 20.0})
    fast = _candidate(2, base_scores + 0.02, fixed={latency.name: -5.0})
    cv = cross_validate(_queries(), [slow, fast], None, [OOS_RULE, latency])
    assert cv is not None
    assert {p.label for p in cv.picks} == {"#2"}


def test_no_feasible_candidate_on_the_training_folds_keeps_the_baseline() -> None:
    rng = np.random.default_rng(5)
    base_scores = _base(rng)
    baseline = _candidate(0, base_scores, np.ones(N_OOS))  # the baseline itself answers every OOS query
    cv = cross_validate(_queries(), [baseline], baseline, [OOS_RULE])
    assert cv is not None
    assert all(p.label is None for p in cv.picks)
    assert cv.gain == pytest.approx(0.0) and cv.in_sample is None
    assert any("the baseline is kept" in n for n in cv.notes)


def test_a_loss_to_an_infeasible_baseline_is_the_price_of_the_constraint() -> None:
    """The baseline answers every OOS query (infeasible); the feasible trials score lower:
    a real loss, said as the cost of meeting the constraint, not 'keep the baseline'."""
    rng = np.random.default_rng(8)
    base_scores = _base(rng)
    baseline = _candidate(0, base_scores, np.ones(N_OOS))
    safer = [_candidate(n, base_scores - 0.05 + rng.normal(0, 0.01, N_IN)) for n in range(1, 6)]
    cv = cross_validate(_queries(), [baseline, *safer], baseline, [OOS_RULE])
    assert cv is not None and cv.baseline_feasible is False and cv.established is False
    assert "the baseline breaks a constraint, so that is the price of meeting it" in cv.summary_line()
    feasible_base = _candidate(0, base_scores)
    worse = cross_validate(_queries(), [feasible_base, *safer], feasible_base, [OOS_RULE])
    assert worse is not None and worse.baseline_feasible is True
    assert worse.picks and all(p.label == "#0" for p in worse.picks)  # the baseline itself is the best pick


def test_folds_are_stratified_seeded_and_order_free() -> None:
    queries = _queries()
    a = stratified_folds(queries, 5, seed=0)
    assert a == stratified_folds(list(reversed(queries)), 5, seed=0)
    assert a != stratified_folds(queries, 5, seed=1)
    for scope_type in {(q.scope, q.query_type) for q in queries}:
        members = [a[q.query_id] for q in queries if (q.scope, q.query_type) == scope_type]
        counts = np.bincount(members, minlength=5)
        assert counts.max() - counts.min() <= 1
    sizes = np.bincount(list(a.values()))
    assert sizes.max() - sizes.min() <= 1


def test_minimised_objective_counts_a_lower_score_as_the_gain() -> None:
    rng = np.random.default_rng(6)
    base_scores = _base(rng)
    lower = [_candidate(n, base_scores - 0.08 + rng.normal(0, 0.01, N_IN)) for n in range(1, 10)]
    cv = cross_validate(
        _queries(), [_candidate(0, base_scores), *lower], _candidate(0, base_scores), [OOS_RULE], maximize=False
    )
    assert cv is not None and cv.gain is not None
    assert cv.gain < 0 and cv.established is True
    assert cv.optimism is not None and cv.optimism >= 0
