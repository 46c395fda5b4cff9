"""Exact equality of two gate solutions and of two BatchResults (every field, every
column, float equality with NaN equal to NaN): the vectorised solve and regate
against the slow reference (reference_solve.py), which takes its row by today's rule
inside ``reference_picks_by_todays_rule``. Used by the tests and by bench/solve_bench.py."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pandas as pd


def same_floats(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def assert_same_mapping(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    assert list(a) == list(b), f"{what}: keys differ: {list(a)} != {list(b)}"
    bad = [k for k in a if not same_floats(a[k], b[k])]
    assert not bad, f"{what}: values differ: " + ", ".join(f"{k}: {a[k]!r} != {b[k]!r}" for k in bad[:5])


def assert_same_frame(a: pd.DataFrame | None, b: pd.DataFrame | None, what: str) -> None:
    if a is None or b is None:
        assert a is None and b is None, f"{what}: one side is None"
        return
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def assert_same_solution(old: Any, new: Any) -> None:
    """Two ThresholdSolutions: chosen values, objective, metrics, violation, table."""
    assert_same_mapping(old.values, new.values, "values")
    assert_same_mapping(old.by_role, new.by_role, "by_role")
    assert same_floats(old.objective, new.objective), (old.objective, new.objective)
    assert same_floats(old.violation, new.violation), (old.violation, new.violation)
    assert old.feasible is new.feasible
    assert_same_mapping(old.metrics, new.metrics, "metrics")
    assert_same_frame(old.table, new.table, "sweep table")


def assert_same_batch(old: Any, new: Any) -> None:
    """Two BatchResults, field by field."""
    assert_same_mapping(old.metrics, new.metrics, "batch metrics")
    assert_same_frame(old.per_query, new.per_query, "per_query")
    assert old.per_query.attrs == new.per_query.attrs
    assert old.unjudged == new.unjudged
    assert_same_frame(old.threshold_sweep, new.threshold_sweep, "threshold_sweep")
    assert_same_frame(old.fallback_histogram, new.fallback_histogram, "fallback_histogram")
    assert old.failed == new.failed
    assert old.queries == new.queries
    assert list(old.hits) == list(new.hits) and old.hits == new.hits
    assert old.qrels == new.qrels
    assert (old.gains, old.scorecard_version, old.metric_names) == (new.gains, new.scorecard_version, new.metric_names)
    assert same_floats(old.threshold_in_effect, new.threshold_in_effect)


@contextmanager
def reference_picks_by_todays_rule(arrays: Any, gates: Sequence[Any]) -> Iterator[None]:
    """Within: the reference solve (reference_solve.py, the margin rule it was written with)
    takes its row by today's rule (tuner.study.gates.gate_choice: a gate kept as found, else the
    least-cutting tie, unless a constraint needs it), so its solution can be compared with
    the vectorised one whole. ``arrays``: the batch's tuner.study.gates.gate_arrays.HitArrays
    (the hits each row shows break ties the gates' values cannot)."""
    import numpy as np

    from threshold import reference_solve
    from tuner.study.gates.gate_arrays import hits_shown
    from tuner.study.gates.gate_choice import choose_gates

    by_role = {g.role: g for g in gates}
    conf, cut = by_role.get("confidence"), by_role.get("min_score")
    ts = conf.values(0.01) if conf else np.array([-np.inf])
    ms = cut.values(0.01) if cut else np.array([-np.inf])
    solved = [g for g in (conf, cut) if g is not None]

    def pick(table: pd.DataFrame, objective: str) -> int:
        return choose_gates(
            table[objective].to_numpy(dtype=float), table["violation"].to_numpy(dtype=float),
            {g.param: table[g.param].to_numpy(dtype=float) for g in solved}, {g.param: g.found for g in solved},
            shown=lambda rows: hits_shown(arrays, ts, ms, conf is None, rows)).row

    margin_rule = reference_solve._pick
    reference_solve._pick = pick
    try:
        yield
    finally:
        reference_solve._pick = margin_rule
