"""run_batch against the real reference backend (backend/, started as a process on
loopback with its generated demo data), cross-checked request by request."""

import importlib.util

import httpx
import pytest
from support.integration import need

from tuner import metrics
from tuner.data.dataset import load_queryset
from tuner.data.labels import LabelStore
from tuner.evaluation import EvalSpec, RequestMapping, ResponseMapping, run_batch


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    need(importlib.util.find_spec("fusion_backend") is not None, "reference backend package not installed (./dev setup)")
    from pathlib import Path

    from support.demo_data import copy_demo_data
    from support.backend import start_backend, write_backend_config

    root = tmp_path_factory.mktemp("demo")
    copy_demo_data(root / "data")
    cfg = write_backend_config(root / "cfg" / "config.yaml", corpus=(root / "data" / "corpus.jsonl").resolve())
    store = LabelStore(root / "labels.db")
    store.import_file(root / "data" / "qrels.txt", "demo")
    queries = load_queryset(Path(root / "data" / "queries.jsonl"), "demo")
    with start_backend(cfg) as backend:
        yield backend, queries, store.qrels("demo")


def test_batch_matches_direct_requests_scored_offline(demo):
    backend, queries, qrels = demo
    spec = EvalSpec(
        request=RequestMapping(url=f"{backend.url}/search"),
        response=ResponseMapping(confidence="confidence", handoff="handoff", fallback_level="fallback_level"),
        top_k=50, concurrency=4,
    )
    result = run_batch(spec, queries, qrels, order_seed=3)
    assert result.metrics["Failed_Queries"] == 0 and result.metrics["N_Queries"] == len(queries)

    # the same requests by hand, scored by the scorecard directly
    effective, handoffs = {}, {}
    with httpx.Client(timeout=10) as client:
        for q in queries:
            body = client.post(f"{backend.url}/search", json={"query": q.query, "top_k": 50, **q.extra}).json()
            handoffs[q.query_id] = body["handoff"]
            effective[q.query_id] = [] if body["handoff"] else [h["doc_id"] for h in body["results"]]
    in_ids = [q.query_id for q in queries.in_scope()]
    expected = metrics.score_rankings(effective, qrels, in_ids)
    got = result.per_query.loc[in_ids]
    for column in ("Primary_Metric_Score", "NDCG@20", "ERR@10", "MAP@10"):
        assert got[column].tolist() == pytest.approx(expected[column].tolist()), column
    oos_ids = [q.query_id for q in queries.oos()]
    assert result.metrics["OOS_FP_Rate"] == pytest.approx(sum(not handoffs[q] for q in oos_ids) / len(oos_ids))
    assert result.metrics["InScope_Handoff_Rate"] == pytest.approx(sum(handoffs[q] for q in in_ids) / len(in_ids))
    assert result.threshold_sweep is not None and result.fallback_histogram is not None
