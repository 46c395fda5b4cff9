"""The per-query ranking of a replayed batch (tuner.evaluation.replay_batch._ranked_order):
the fast path (a SIMD sort on keys with cut low bits, runs the cut merges re-sorted
exactly) orders every query's candidates exactly as ``np.lexsort`` by (query, score
descending, corpus order) does, with exact ties, ties in all but the last bit, -0.0,
empty queries and queries too long for the position bits."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.evaluation.replay_batch import _Layout, _ranked_order


def candidates(seed: int, *, n_q: int = 60, longest: int = 160) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, longest + 1, size=n_q)
    counts[::7] = 0  # queries without candidates
    seg = np.repeat(np.arange(n_q), counts)
    base = rng.choice(rng.random(40), size=seg.size)  # few distinct values: many exact ties
    nudge = rng.integers(-2, 3, size=seg.size)  # ... and many a few ulps apart
    scores = base + nudge * np.spacing(base)
    scores[rng.random(seg.size) < 0.02] = 0.0
    scores[rng.random(seg.size) < 0.02] = -0.0
    rrf = 0.7 / (rng.integers(1, 60, size=seg.size) + 20.0) + 0.3 / (rng.integers(1, 60, size=seg.size) + 20.0)
    use = rng.random(seg.size) < 0.4
    scores[use] = rrf[use]  # RRF sums: equal values reached in different orders differ in the last bit
    return scores, seg


@pytest.mark.parametrize("seed", range(12))
def test_the_fast_ranking_is_the_lexsort_ranking(seed: int) -> None:
    scores, seg = candidates(seed, longest=300 if seed % 4 == 3 else 160)
    layout = _Layout.of(seg, int(seg.max(initial=0)) + 1)
    want = np.lexsort((np.arange(seg.size), -scores, seg))
    got = _ranked_order(scores, seg, layout)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_ranked_order(scores, seg), want)  # the path without a layout


def test_negative_scores_take_the_general_path() -> None:
    scores, seg = candidates(3)
    scores = scores - 0.5
    layout = _Layout.of(seg, int(seg.max()) + 1)
    np.testing.assert_array_equal(_ranked_order(scores, seg, layout), np.lexsort((np.arange(seg.size), -scores, seg)))


def test_a_candidate_missing_from_the_explained_docs_is_named() -> None:
    from tuner.errors import ResponseMappingError
    from tuner.evaluation.fusion_replay import Explained, FusionSetting
    from tuner.evaluation.replay_batch import ReplayBatch

    lists = {"bm25": (np.array([4, 9]), np.array([2.0, 1.0])), "dense": (np.array([9]), np.array([0.8]))}
    docs = {4: "d4", 9: "d9"}
    whole = Explained(("bm25", "dense"), 20000, (("primary", lists),), docs, dict.fromkeys(docs),
                      dict.fromkeys(docs), {4: 0.5, 9: 0.8})
    batch = ReplayBatch({"q1": whole}, ["q1"], [True], {"q1": {"d9": 3}}, top_k=10)
    table = batch.table(FusionSetting(method="rrf", weights={"bm25": 0.5, "dense": 0.5}, rrf_k=10))
    assert list(table.table.docs[:2]) == ["d9", "d4"] and table.table.grades[:2].tolist() == [3, -1]
    short = Explained(("bm25", "dense"), 20000, (("primary", lists),), {4: "d4"}, {4: None}, {4: None}, {4: 0.5})
    with pytest.raises(ResponseMappingError, match="query q1: the explanation lists candidate 9 but not in its docs"):
        ReplayBatch({"q1": short}, ["q1"], [True], {}, top_k=10).table(FusionSetting(weights={"bm25": 1, "dense": 1}))
