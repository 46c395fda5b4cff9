"""A report's group summaries (overall, by query type, by source) are pandas' own numbers:
computed from numpy masks, checked here against the frame-per-group way they were first
written (the oracle below), on batches with missing values, failures and empty groups."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from report.test_report_writer import _result
from tuner import metrics as scorecard
from tuner.report.build import GROUP_BY, PRIMARY, _groups, jsonable


def _oracle(pq: pd.DataFrame) -> dict:
    primary = [m for m in scorecard.PRIMARY_SCORECARD if m in pq.columns]

    def summary(frame: pd.DataFrame) -> dict:
        in_scope, oos = frame[frame["scope"] == "in"], frame[frame["scope"] == "oos"]
        row = {"n_queries": len(frame), "n_in_scope": len(in_scope), "n_oos": len(oos)}
        for name in [PRIMARY, *primary, "Judged@10"]:
            row[name] = float(in_scope[name].mean()) if len(in_scope) and name in in_scope else None
        row["InScope_Handoff_Rate"] = float((~in_scope["answered"].astype(bool)).mean()) if len(in_scope) else None
        row["OOS_FP_Rate"] = float(oos["answered"].astype(bool).mean()) if len(oos) else None
        row["Failed_Queries"] = int((frame["status"] == "failed").sum())
        row["Latency_Avg_ms"] = float(frame["latency_ms"].mean()) if frame["latency_ms"].notna().any() else None
        return row

    groups = {"overall": summary(pq)}
    for column in GROUP_BY:
        groups[column] = {str(name): summary(part) for name, part in pq.groupby(column, sort=True)}
    return groups


def _shuffled(pq: pd.DataFrame, seed: int, n: int) -> pd.DataFrame:
    """``n`` rows drawn from ``pq`` with random metric values, NaN holes, scopes, answers,
    statuses and group keys (some groups all out of scope, some without latency)."""
    rng = np.random.default_rng(seed)
    frame = pq.iloc[rng.integers(0, len(pq), n)].reset_index(drop=True)
    frame.index = [f"q{i}" for i in range(n)]
    for col in frame.columns:
        if frame[col].dtype == np.float64:
            values = rng.random(n) * rng.choice([1.0, 1e-3, 7.0])
            values[rng.random(n) < 0.2] = np.nan
            frame[col] = values
    frame["scope"] = rng.choice(["in", "oos"], n, p=[0.7, 0.3])
    frame["answered"] = rng.random(n) < 0.6
    frame["status"] = rng.choice(["ok", "failed"], n, p=[0.85, 0.15])
    frame["query_type"] = rng.choice(["short", "long_tail", "zz", "a b"], n)
    frame["source"] = rng.choice(["docs", "faq", "oos"], n)
    frame.loc[frame["source"] == "oos", "scope"] = "oos"
    frame.loc[frame["query_type"] == "zz", "latency_ms"] = np.nan
    return frame


@pytest.mark.parametrize("seed", range(6))
def test_group_summaries_are_pandas_own_numbers(seed: int) -> None:
    base = _result()
    pq = _shuffled(base.per_query, seed, n=[7, 40, 300, 1, 3, 120][seed])
    result = replace(base, per_query=pq)
    got, want = jsonable(_groups(result)), jsonable(_oracle(pq))
    assert json.dumps(got) == json.dumps(want)  # every digit, NaN as None, keys in the same order
    assert got["overall"]["n_queries"] == len(pq)


def test_the_demo_shaped_batch_groups_as_before() -> None:
    result = _result()
    assert json.dumps(jsonable(_groups(result))) == json.dumps(jsonable(_oracle(result.per_query)))


def test_label_counts_are_counted_again_for_other_or_grown_labels() -> None:
    from tuner.report.build import _grade_counts

    qrels = {"a": {"d1": 3, "d2": 0}, "b": {"d3": 1}}
    assert _grade_counts(qrels) == {"L0": 1, "L1": 1, "L2": 0, "L3": 1}
    assert _grade_counts(qrels) == {"L0": 1, "L1": 1, "L2": 0, "L3": 1}  # held by the helper: counted once
    qrels["b"]["d4"] = 2  # grown in place
    assert _grade_counts(qrels) == {"L0": 1, "L1": 1, "L2": 1, "L3": 1}
    assert _grade_counts({"a": {"d1": 2}}) == {"L0": 0, "L1": 0, "L2": 1, "L3": 0}
