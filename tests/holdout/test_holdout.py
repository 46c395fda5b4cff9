"""The holdout split: deterministic, stratified, disjoint, complete, order-independent."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from tuner.data.dataset import Query
from tuner.errors import ConfigError
from tuner.evaluation.holdout import HoldoutConfig, allocate, draw_split, split_queries, stratum_of

KEYS = ("query_type", "scope")


def make_queries(counts: dict[tuple[str, str], int]) -> list[Query]:
    out = []
    for (qtype, scope), n in counts.items():
        for i in range(n):
            out.append(Query(f"{qtype}-{scope}-{i}", f"text {i}", qtype, "src", scope))
    return out


COUNTS = {("short", "in"): 37, ("long", "in"): 23, ("date", "in"): 11, ("short", "oos"): 7, ("long", "oos"): 2, ("rare", "in"): 1}


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("fraction", [0.2, 0.3, 0.5])
def test_split_is_disjoint_complete_and_stratified(seed, fraction):
    queries = make_queries(COUNTS)
    split = draw_split(queries, fraction=fraction, seed=seed)
    ids = [q.query_id for q in queries]
    assert set(split.tune).isdisjoint(split.holdout)
    assert sorted(split.tune + split.holdout) == sorted(ids)
    assert len(split.holdout) == math.floor(len(ids) * fraction + 0.5)
    held = set(split.holdout)
    per_stratum = Counter(stratum_of(q, KEYS) for q in queries if q.query_id in held)
    for key, n in COUNTS.items():
        assert abs(per_stratum[key] - n * fraction) < 1, (key, per_stratum[key], n * fraction)
    # Both parts keep query-set order.
    assert list(split.tune) == [i for i in ids if i not in held]
    assert list(split.holdout) == [i for i in ids if i in held]


def test_same_seed_same_split_and_file_order_does_not_matter():
    queries = make_queries(COUNTS)
    shuffled = queries[:]
    random.Random(5).shuffle(shuffled)
    a = draw_split(queries, fraction=0.3, seed=42)
    b = draw_split(shuffled, fraction=0.3, seed=42)
    assert set(a.holdout) == set(b.holdout)
    assert draw_split(queries, fraction=0.3, seed=42) == a


def test_different_seeds_draw_different_holdouts():
    queries = make_queries(COUNTS)
    holdouts = {frozenset(draw_split(queries, fraction=0.3, seed=s).holdout) for s in range(10)}
    assert len(holdouts) == 10


def test_adding_a_query_moves_few_old_ones():
    base = make_queries({("short", "in"): 60})
    grown = base + [Query("short-in-new", "t", "short", "src", "in")]
    a = set(draw_split(base, fraction=0.3, seed=3).holdout)
    b = set(draw_split(grown, fraction=0.3, seed=3).holdout) - {"short-in-new"}
    assert len(a ^ b) <= 2


def test_allocate_hits_total_and_stays_within_one():
    sizes = {("a",): 5, ("b",): 5, ("c",): 5}
    quotas = allocate(sizes, 0.5)
    assert sum(quotas.values()) == math.floor(15 * 0.5 + 0.5)
    assert all(abs(quotas[k] - n * 0.5) < 1 for k, n in sizes.items())


def test_split_field_is_used_when_every_query_has_one():
    queries = [Query(f"q{i}", "t", "x", "s", "in", split="holdout" if i % 4 == 0 else "tune") for i in range(12)]
    split = split_queries(queries, HoldoutConfig())
    assert split.source == "split_field"
    assert split.holdout == tuple(f"q{i}" for i in range(0, 12, 4))
    drawn = split_queries(queries, HoldoutConfig(use_split_field=False, fraction=0.5))
    assert drawn.source == "drawn" and len(drawn.holdout) == 6


def test_partial_split_field_draws_a_split():
    queries = [Query(f"q{i}", "t", "x", "s", "in", split="tune" if i else None) for i in range(10)]
    assert split_queries(queries).source == "drawn"


def test_bad_fraction_and_unknown_keys_are_rejected():
    with pytest.raises(ConfigError, match="fraction"):
        draw_split(make_queries(COUNTS), fraction=1.0, seed=0)
    with pytest.raises(ValueError):
        HoldoutConfig(fraction=0.3, sed=1)
    with pytest.raises(ConfigError, match="no query to tune"):
        draw_split(make_queries({("a", "in"): 1}), fraction=0.9, seed=0)


def test_tune_split_restricts_the_query_set_only_when_enabled():
    from tuner.data.dataset import QuerySet
    from tuner.evaluation.holdout import tune_split

    qs = QuerySet("d", "h", tuple(make_queries(COUNTS)))
    same, none = tune_split(qs, HoldoutConfig(enabled=False))
    assert same is qs and none is None
    tuned, split = tune_split(qs, HoldoutConfig(fraction=0.25, seed=9))
    assert tuned.query_ids == list(split.tune) and not set(tuned.query_ids) & set(split.holdout)
    assert tuned.dataset_id == qs.dataset_id
