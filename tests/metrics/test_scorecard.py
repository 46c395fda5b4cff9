"""Unit tests of the scorecard: expected values are written as the formulas."""

from __future__ import annotations

import inspect
from math import log2

import numpy as np
import pandas as pd
import pytest

from tuner.errors import InputError
from tuner.metrics import (
    DEFAULT_METRICS,
    PRIMARY_METRIC,
    PRIMARY_SCORECARD,
    SECONDARY_METRICS,
    aggregate,
    judged_at_k,
    list_metrics,
    prepare,
    score_batch,
    score_rankings,
)

# One query, ranking grades 3, unjudged, 1, 0, 2 (ranks 1..5); judged grades of the
# query: a=3, c=1, d=0, e=2, f=3, g=2 (f and g are never retrieved).
QRELS = {"q": {"a": 3, "c": 1, "d": 0, "e": 2, "f": 3, "g": 2}}
RANKING = {"q": ["a", "b", "c", "d", "e"]}
RANKED = [3, 0, 1, 0, 2]
JUDGED = [3, 1, 0, 2, 3, 2]


def score(metric: str, gains: str = "linear", rankings=RANKING, qrels=QRELS, level: int = 1) -> float:
    df = score_rankings(rankings, qrels, list(rankings), gains=gains, metrics=[metric], relevance_level=level)
    return float(df[metric].iloc[0])


def dcg(gains: list[float], k: int) -> float:
    return sum(g / log2(r + 1) for r, g in enumerate(gains[:k], start=1))


def test_ndcg_linear_is_dcg_over_ideal_dcg_of_all_judged_docs():
    for k in (1, 3, 5, 20):
        expected = dcg(RANKED, k) / dcg(sorted(JUDGED, reverse=True), k)
        assert score(f"NDCG@{k}") == pytest.approx(expected)


def test_ndcg_exp_uses_two_to_the_grade_minus_one():
    exp = lambda grades: [2**g - 1 for g in grades]  # noqa: E731
    expected = dcg(exp(RANKED), 10) / dcg(exp(sorted(JUDGED, reverse=True)), 10)
    assert score("NDCG@10", gains="exp") == pytest.approx(expected)


def test_ndcg_without_cutoff_uses_whole_ranking_and_whole_ideal():
    expected = dcg(RANKED, 99) / dcg(sorted(JUDGED, reverse=True), 99)
    assert score("NDCG") == pytest.approx(expected)


@pytest.mark.parametrize("gains,stop", [
    ("linear", lambda g: g / 4),  # gain(g) / (gain(3) + 1)
    ("exp", lambda g: (2**g - 1) / 2**3),  # Chapelle's (2^g - 1) / 2^max
])
def test_err_is_cascade_of_stop_probabilities(gains, stop):
    k = 4
    expected, reach = 0.0, 1.0
    for rank, grade in enumerate(RANKED[:k], start=1):
        expected += reach * stop(grade) / rank
        reach *= 1 - stop(grade)
    assert score(f"ERR@{k}", gains=gains) == pytest.approx(expected)


def test_precision_family_divides_by_k_even_when_the_ranking_is_shorter():
    k = 10
    assert score(f"P@{k}") == pytest.approx(sum(g >= 1 for g in RANKED) / k)
    assert score(f"Useful_Precision@{k}") == pytest.approx(sum(g >= 1 for g in RANKED) / k)
    assert score(f"Strong_Precision@{k}") == pytest.approx(sum(g >= 2 for g in RANKED) / k)
    assert score(f"Exact_Precision@{k}") == pytest.approx(sum(g == 3 for g in RANKED) / k)
    assert score("Strong_Precision@2") == pytest.approx(1 / 2)


def test_avg_grade_counts_missing_positions_as_zero():
    assert score("Avg_Grade@10") == pytest.approx(sum(RANKED) / 10)
    assert score("Avg_Grade@2") == pytest.approx((3 + 0) / 2)


@pytest.mark.parametrize("gains,gain", [("linear", lambda g: g), ("exp", lambda g: 2**g - 1)])
def test_gain_recall_is_retrieved_gain_over_total_judged_gain(gains, gain):
    for k in (1, 3, 20):
        expected = sum(gain(g) for g in RANKED[:k]) / sum(gain(g) for g in JUDGED)
        assert score(f"Gain_Recall@{k}", gains=gains) == pytest.approx(expected)


def test_recall_is_binary_at_grade_one():
    relevant = sum(g >= 1 for g in JUDGED)
    assert score("Recall@3") == pytest.approx(sum(g >= 1 for g in RANKED[:3]) / relevant)
    assert score("Recall@50") == pytest.approx(sum(g >= 1 for g in RANKED) / relevant)


def test_success_and_reciprocal_rank_thresholds():
    assert score("Exact_Success@1") == 1.0
    assert score("Strong_Success@1") == 1.0
    assert score("MRR_Exact@10") == pytest.approx(1 / 1)
    ranking = {"q": ["c", "d", "e", "a"]}  # grades 1, 0, 2, 3
    assert score("Success@1", rankings=ranking) == 1.0
    assert score("Strong_Success@2", rankings=ranking) == 0.0
    assert score("Strong_Success@3", rankings=ranking) == 1.0
    assert score("MRR@10", rankings=ranking) == pytest.approx(1 / 1)
    assert score("MRR_Strong@10", rankings=ranking) == pytest.approx(1 / 3)
    assert score("MRR_Exact@10", rankings=ranking) == pytest.approx(1 / 4)
    assert score("MRR_Exact@3", rankings=ranking) == 0.0
    assert score("Exact_Success@3", rankings=ranking) == 0.0


def test_binary_average_precision_divides_by_all_relevant():
    hits = [g >= 1 for g in RANKED]
    precisions = [sum(hits[:r]) / r for r in range(1, len(hits) + 1) if hits[r - 1]]
    assert score("AP") == pytest.approx(sum(precisions) / sum(g >= 1 for g in JUDGED))


def test_graded_map_weights_precision_by_grade_over_max_grade():
    k = 10
    weights = [g / 3 for g in RANKED]
    weighted_precision = [sum(weights[:r]) / r for r in range(1, len(RANKED) + 1)]
    numerator = sum(p for p, g in zip(weighted_precision, RANKED) if g > 0)
    expected = numerator / min(k, sum(g >= 1 for g in JUDGED))
    assert score(f"MAP@{k}") == pytest.approx(expected)
    assert score("MAP@2") == pytest.approx(weighted_precision[0] / 2)


def test_unjudged_documents_count_as_irrelevant():
    judged = {"q": {"a": 3, "b": 0}}
    assert score("NDCG@5", rankings={"q": ["x", "a"]}, qrels=judged) == pytest.approx((3 / log2(3)) / 3)


def test_repeated_document_is_credited_once():
    repeated = {"q": ["a", "a", "a"]}
    assert score("P@3", rankings=repeated) == pytest.approx(1 / 3)
    assert score("Avg_Grade@3", rankings=repeated) == pytest.approx(3 / 3)


def test_empty_missing_and_unjudged_queries_score_zero_and_are_kept_in_order():
    rankings = {"full": ["a", "e"], "empty": []}
    qrels = {"full": {"a": 3, "e": 2}, "empty": {"a": 3}, "handed_off": {"a": 1}}
    order = ["handed_off", "full", "empty", "no_labels"]
    rankings["no_labels"] = ["a"]
    df = score_rankings(rankings, qrels, order)
    assert list(df.index) == order
    assert list(df.columns) == [*DEFAULT_METRICS, PRIMARY_METRIC]
    zero_rows = df.loc[["handed_off", "empty", "no_labels"]]
    assert (zero_rows.to_numpy() == 0).all()
    assert df.loc["full", "NDCG@20"] == pytest.approx(1.0)


def test_primary_metric_score_is_mean_of_scorecard_with_avg_grade_over_three():
    rankings = {"q": RANKING["q"], "r": ["f", "g", "x"]}
    qrels = {**QRELS, "r": {"f": 3, "g": 1, "h": 2}}
    df = score_rankings(rankings, qrels, ["q", "r"], metrics=list(PRIMARY_SCORECARD))
    scaled = df[list(PRIMARY_SCORECARD)].copy()
    scaled["Avg_Grade@10"] /= 3
    assert np.allclose(df[PRIMARY_METRIC], scaled.sum(axis=1) / len(PRIMARY_SCORECARD))


def test_primary_metric_score_is_present_even_when_other_metrics_are_asked():
    df = score_rankings(RANKING, QRELS, ["q"], metrics=["P@1"])
    full = score_rankings(RANKING, QRELS, ["q"])
    assert list(df.columns) == ["P@1", PRIMARY_METRIC]
    assert df[PRIMARY_METRIC].iloc[0] == pytest.approx(full[PRIMARY_METRIC].iloc[0])


def test_aggregate_is_the_column_mean():
    rankings = {"q": RANKING["q"], "r": ["f"]}
    df = score_rankings(rankings, {**QRELS, "r": {"f": 2}}, ["q", "r"])
    agg = aggregate(df)
    assert set(agg) == set(df.columns)
    for column in df.columns:
        assert agg[column] == pytest.approx((df[column].iloc[0] + df[column].iloc[1]) / 2)


def test_any_cutoff_parses_from_the_name():
    assert score("NDCG@23") == pytest.approx(dcg(RANKED, 23) / dcg(sorted(JUDGED, reverse=True), 23))
    assert score("P@7") == pytest.approx(sum(g >= 1 for g in RANKED) / 7)


def test_truncated_preparation_gives_the_same_values_as_full_depth():
    rng = np.random.default_rng(7)
    docs = [f"d{i}" for i in range(120)]
    qrels = {f"q{i}": {d: int(rng.integers(0, 4)) for d in rng.choice(docs, 60, replace=False)} for i in range(20)}
    rankings = {q: list(rng.choice(docs, int(rng.integers(0, 120)), replace=False)) for q in qrels}
    fast = score_rankings(rankings, qrels, list(qrels))
    full = score_batch(prepare(rankings, qrels, list(qrels)))
    pd.testing.assert_frame_equal(fast, full)


def test_judged_at_k_is_share_of_shown_results_with_a_label():
    rankings = {"q": ["a", "b", "c", "x"], "empty": []}
    cov = judged_at_k(rankings, QRELS, ["q", "empty"], k=3)
    assert cov["q"] == pytest.approx(2 / 3)  # a, c judged; b not
    assert np.isnan(cov["empty"])
    assert judged_at_k({"q": ["a", "x"]}, QRELS, ["q"], k=10)["q"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("bad,message", [
    ("NDCG@0", "cutoff must be >= 1"),
    ("Strong_Precision", "needs a cutoff"),
    ("ndcg@10", "did you mean NDCG"),
    ("Bogus@10", "unknown metric"),
    # trec_eval's map is AP here; the graded MAP@10 is another number, never the suggestion
    ("MAP", r"trec_eval's map is AP here .*; use AP, or MAP@k for the graded variant"),
    ("map", r"did you mean AP\? trec_eval's map is AP here"),
    ("map@10", r"did you mean AP@10\? trec_eval's map is AP here, map_cut_k is AP@k"),
])
def test_bad_metric_names_raise_input_error(bad, message):
    with pytest.raises(InputError, match=message):
        score_rankings(RANKING, QRELS, ["q"], metrics=[bad])


def test_grade_outside_scale_names_query_and_doc():
    for bad in (4, -1, 2.5, 300):
        with pytest.raises(InputError, match=rf"query 'q' doc 'z': grade {bad} is not an integer in 0\.\.3"):
            score_rankings(RANKING, {"q": {"a": np.int64(3), "z": bad}}, ["q"])


def test_duplicate_query_id_and_unknown_gain_scheme_are_rejected():
    with pytest.raises(InputError, match="listed twice"):
        score_rankings(RANKING, QRELS, ["q", "q"])
    with pytest.raises(InputError, match="unknown gain scheme 'log'"):
        score_rankings(RANKING, QRELS, ["q"], gains="log")


def test_public_contract_signature_and_registry():
    params = inspect.signature(score_rankings).parameters
    assert list(params) == ["rankings", "qrels", "query_ids", "gains", "metrics", "relevance_level"]
    assert params["relevance_level"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["relevance_level"].default == 1
    names = {family.name for family in list_metrics()}
    for metric in DEFAULT_METRICS:
        assert metric.split("@")[0] in names
    assert set(PRIMARY_SCORECARD).isdisjoint(SECONDARY_METRICS)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_binary_metrics_count_grades_at_or_above_the_relevance_level(level):
    hits = [g >= level for g in RANKED]
    relevant = sum(g >= level for g in JUDGED)
    assert score("P@4", level=level) == pytest.approx(sum(hits[:4]) / 4)
    assert score("Recall@3", level=level) == pytest.approx(sum(hits[:3]) / relevant)
    assert score("Success@2", level=level) == float(any(hits[:2]))
    assert score("MRR", level=level) == pytest.approx(1 / (hits.index(True) + 1))
    def ap(k: int) -> float:
        return sum(sum(hits[:r]) / r for r in range(1, k + 1) if hits[r - 1]) / relevant

    assert score("AP", level=level) == pytest.approx(ap(len(hits)))
    assert score("AP@3", level=level) == pytest.approx(ap(3))


def test_graded_and_named_level_metrics_ignore_the_relevance_level():
    # trec_eval's ndcg ignores -l; Strong_/Exact_ name their own level; graded MAP
    # and the rest use the grades themselves.
    ranking = {"q": ["c", "e", "b", "a", "d"]}
    graded = ["NDCG@5", "NDCG", "DCG@3", "Useful_Precision@5", "ERR@5", "Avg_Grade@5", "Gain_Recall@5", "MAP@5", "Strong_Precision@5",
              "Exact_Precision@5", "Strong_Success@1", "Exact_Success@3", "MRR_Strong@5", "MRR_Exact@5"]
    base = score_rankings(ranking, QRELS, ["q"], metrics=graded)
    for level in (2, 3):
        moved = score_rankings(ranking, QRELS, ["q"], metrics=graded, relevance_level=level)
        pd.testing.assert_series_equal(moved.loc["q", graded], base.loc["q", graded])


def test_default_relevance_level_is_the_live_scorecard():
    rankings = {"q": RANKING["q"], "r": ["f", "g", "x"]}
    qrels = {**QRELS, "r": {"f": 3, "g": 1, "h": 2}}
    default = score_rankings(rankings, qrels, ["q", "r"])
    explicit = score_rankings(rankings, qrels, ["q", "r"], relevance_level=1)
    pd.testing.assert_frame_equal(default, explicit)
    assert default.attrs["relevance_level"] == 1
    at_two = score_rankings(rankings, qrels, ["q", "r"], relevance_level=2, metrics=["P@10", *PRIMARY_SCORECARD])
    default = score_rankings(rankings, qrels, ["q", "r"], metrics=["P@10", *PRIMARY_SCORECARD])
    assert at_two.attrs["relevance_level"] == 2
    # -l moves the binary measures a TREC user compares, never the tuner's objective.
    assert at_two.loc["r", "P@10"] < default.loc["r", "P@10"]
    assert at_two.loc["r", PRIMARY_METRIC] == default.loc["r", PRIMARY_METRIC]


@pytest.mark.parametrize("bad", [0, 4, -1, 2.5, True, "2"])
def test_relevance_level_outside_the_grade_scale_is_an_input_error(bad):
    with pytest.raises(InputError, match=rf"relevance level {bad!r} is not a grade in 1\.\.3; use 1"):
        score_rankings(RANKING, QRELS, ["q"], relevance_level=bad)
    assert prepare(RANKING, QRELS, ["q"], max_grade=4, relevance_level=4).relevance_level == 4


def test_binary_flag_of_every_family_says_whether_the_relevance_level_moves_it():
    # A grade-1 hit on top of each ranking: any metric reading L changes from L=1 to L=2.
    rankings = {"q": ["c", "e", "a", "d"], "r": ["g1", "x", "y", "f"]}
    qrels = {**QRELS, "r": {"g1": 1, "f": 3, "h": 2, "i": 1}}
    names = [f"{family.name}@3" for family in list_metrics()]
    one = score_rankings(rankings, qrels, ["q", "r"], metrics=names)
    two = score_rankings(rankings, qrels, ["q", "r"], metrics=names, relevance_level=2)
    for family, name in zip(list_metrics(), names):
        moved = not np.allclose(one[name], two[name], equal_nan=True)
        assert moved == family.binary, f"{family.name}: binary={family.binary} but moved={moved}"
        assert family.trec_eval  # every family states its trec_eval measure, or "none"
