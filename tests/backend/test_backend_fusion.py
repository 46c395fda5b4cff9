"""Fusion formulas, checked against the definitions written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fusion_backend.fusion import Candidates, linear, minmax, rrf, z_cdf


def cands(docs: list[int], scores: list[float]) -> Candidates:
    return Candidates(np.array(docs, dtype=np.int64), np.array(scores, dtype=np.float64))


def as_dict(fused) -> dict[int, float]:  # type: ignore[no-untyped-def]
    return dict(zip(fused.docs.tolist(), fused.scores.tolist()))


def test_rrf_is_weighted_reciprocal_rank_divided_by_its_maximum() -> None:
    k, wa, wb = 10.0, 2.0, 0.5
    got = as_dict(rrf({"a": cands([7, 3, 5], [9, 8, 1]), "b": cands([3, 9], [0.9, 0.1])},
                      {"a": wa, "b": wb}, k, wa + wb))
    top = (wa + wb) / (k + 1)
    assert got[7] == pytest.approx(wa / (k + 1) / top)
    assert got[3] == pytest.approx((wa / (k + 2) + wb / (k + 1)) / top)
    assert got[5] == pytest.approx(wa / (k + 3) / top)
    assert got[9] == pytest.approx(wb / (k + 2) / top)


def test_rrf_first_in_every_source_scores_one() -> None:
    got = as_dict(rrf({"a": cands([4, 1], [2, 1]), "b": cands([4], [5])}, {"a": 1.0, "b": 3.0}, 60, 4.0))
    assert got[4] == pytest.approx(1.0)
    assert 0 < got[1] < 1


def test_total_weight_counts_sources_that_returned_nothing() -> None:
    got = as_dict(rrf({"a": cands([1], [1.0]), "b": cands([], [])}, {"a": 1.0, "b": 1.0}, 60, 2.0))
    assert got[1] == pytest.approx(0.5)


def test_zero_weight_source_contributes_no_candidates() -> None:
    fused = rrf({"a": cands([1], [1.0]), "b": cands([2], [1.0])}, {"a": 1.0, "b": 0.0}, 60, 1.0)
    assert fused.docs.tolist() == [1]
    fused = linear({"a": cands([1], [1.0]), "b": cands([2], [1.0])}, {"a": 1.0, "b": 0.0}, "minmax", 1.0)
    assert fused.docs.tolist() == [1]


def test_linear_minmax_is_weighted_mean_of_normalised_scores() -> None:
    a, b = [10.0, 6.0, 2.0], [0.8, 0.4]
    wa, wb = 1.0, 3.0
    got = as_dict(linear({"a": cands([1, 2, 3], a), "b": cands([2, 4], b)}, {"a": wa, "b": wb}, "minmax", wa + wb))
    norm_a = {1: (10 - 2) / 8, 2: (6 - 2) / 8, 3: 0.0}
    norm_b = {2: 1.0, 4: 0.0}
    for doc in (1, 2, 3, 4):
        expected = (wa * norm_a.get(doc, 0.0) + wb * norm_b.get(doc, 0.0)) / (wa + wb)
        assert got[doc] == pytest.approx(expected)


def test_linear_z_maps_z_scores_through_the_normal_cdf() -> None:
    scores = [3.0, 1.0, 0.5, 0.1]
    got = as_dict(linear({"a": cands([1, 2, 3, 4], scores)}, {"a": 2.0}, "z", 2.0))
    mean, std = np.mean(scores), np.std(scores)
    for doc, s in zip((1, 2, 3, 4), scores):
        z = (s - mean) / std
        assert got[doc] == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))))


def test_normalisations_stay_in_unit_interval_and_handle_ties() -> None:
    rng = np.random.default_rng(0)
    for scores in (rng.normal(size=50) * 40, rng.random(7)):
        for fn in (minmax, z_cdf):
            out = fn(scores)
            assert out.min() >= 0 and out.max() <= 1
            assert np.array_equal(np.argsort(out, kind="stable"), np.argsort(scores, kind="stable"))
    assert minmax(np.array([2.0, 2.0])).tolist() == [1.0, 1.0]
    assert z_cdf(np.array([2.0, 2.0])).tolist() == [0.5, 0.5]
    assert minmax(np.array([])).size == 0


def test_nothing_to_fuse_gives_empty() -> None:
    assert rrf({"a": cands([], [])}, {"a": 1.0}, 60, 1.0).docs.size == 0
