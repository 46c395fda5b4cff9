"""Fusion replay is exact on the reference backend: one explained retrieval, replayed at
another fusion setting, gives the response the live backend gives at that setting
(hits, scores to the last bit, confidence, handoff, fallback level) and so the same
per-query scorecard. Real backend process on the generated demo data; each setting is
served through POST /admin/reload (which answers exactly as a fresh start: the reload
tests check that). RRF and linear (min-max and z), weights with a source switched off,
ties, the recency boost, the date-fallback tiers, the citation cut and the gate."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
from support.backend import start_backend, write_backend_config

from tuner.data.dataset import Query, QuerySet
from tuner.evaluation.fusion_replay import Explained, FusionSetting, replay
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import evaluate_responses

pytestmark = pytest.mark.slow

NOW = "2025-06-28"  # the demo catalog's "today": temporal queries' windows have content
TOP_K = 20

#: the retrieval: every source on, the defaults otherwise (recency 0, no gates)
SERVED: dict[str, Any] = {}
#: settings replayed from that one retrieval, then served live and compared
SETTINGS = [
    FusionSetting(method="rrf", weights={"bm25": 1.0, "dense": 1.0}, rrf_k=60),
    FusionSetting(method="rrf", weights={"bm25": 0.3, "dense": 1.7}, rrf_k=5, recency_weight=0.8,
                  recency_half_life_days=20, min_score=0.35, confidence_threshold=0.2, top_m=5),
    FusionSetting(method="rrf", weights={"bm25": 1.0, "dense": 0.0}, rrf_k=0),  # dense off; k 0: many ties
    FusionSetting(method="linear", weights={"bm25": 0.6, "dense": 1.4}, normalization="minmax", recency_weight=0.3,
                  recency_half_life_days=90, min_score=0.2),
    FusionSetting(method="linear", weights={"bm25": 2.0, "dense": 0.5}, normalization="z", confidence_threshold=0.15,
                  top_m=1),
    FusionSetting(method="linear", weights={"bm25": 0.0, "dense": 1.0}, normalization="minmax", recency_weight=2.0,
                  recency_half_life_days=7),
    # fusion.normalize_weights: false -- fused scores not divided by the weight sum
    FusionSetting(method="rrf", weights={"bm25": 1.0, "dense": 1.0}, rrf_k=60, min_score=0.6, normalize_weights=False),
    FusionSetting(method="linear", weights={"bm25": 0.7, "dense": 0.9}, normalization="z", min_score=0.5,
                  normalize_weights=False),
]


def _overrides(s: FusionSetting) -> dict[str, Any]:
    return {"fusion": {"method": s.method, "rrf_k": s.rrf_k, "weights": dict(s.weights),
                       "normalization": s.normalization, "normalize_weights": s.normalize_weights},
            "recency": {"weight": s.recency_weight, "half_life_days": s.recency_half_life_days},
            "citation": {"min_score": s.min_score},
            "confidence": {"threshold": s.confidence_threshold, "top_m": s.top_m}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from support.demo_data import copy_demo_data

    root = tmp_path_factory.mktemp("replay-demo")
    copy_demo_data(root / "demo")
    rows = [json.loads(line) for line in (root / "demo" / "queries.jsonl").read_text().splitlines()]
    temporal = [q for q in rows if q.get("date_hint_days") is not None][:25]
    other = [q for q in rows if q.get("date_hint_days") is None][::6][:25]
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "demo" / "qrels.txt").read_text().splitlines():  # TREC: qid 0 doc grade
        qid, _, doc, grade = line.split()
        qrels.setdefault(qid, {})[doc] = int(grade)
    return {"root": root, "queries": temporal + other, "qrels": qrels,
            "corpus": root / "demo" / "corpus.jsonl", "cache": root / "index-cache"}


def _ask(client: httpx.Client, url: str, q: dict[str, Any], explain: bool) -> dict[str, Any]:
    body = {"now": NOW, **{k: v for k, v in q.items() if k in ("query", "date_hint_days", "query_id")},
            "top_k": TOP_K, "explain": explain}
    response = client.post(url, json=body)
    response.raise_for_status()
    return response.json()


def _parsed(payload: dict[str, Any]) -> ParsedResponse:
    hits = tuple(Hit(h["doc_id"], h["score"], h["title"]) for h in payload["results"])
    return ParsedResponse(hits, payload["confidence"], payload["handoff"], payload["fallback_level"])


def test_replayed_responses_and_scorecards_equal_the_live_backend_at_every_setting(demo, tmp_path) -> None:
    config = write_backend_config(tmp_path / "config.yaml", corpus=demo["corpus"], index_cache=demo["cache"],
                                  overrides=SERVED)
    queries = demo["queries"]
    qs = QuerySet("replay", "h", tuple(Query(q["query_id"], q["query"], q.get("query_type", "short"),
                                             q.get("source", "s"), q.get("scope", "in")) for q in queries))
    with start_backend(config) as backend, httpx.Client(timeout=60) as client:
        url = f"{backend.url}/search"
        explained = {}
        for q in queries:
            payload = _ask(client, url, q, explain=True)
            explained[q["query_id"]] = Explained.parse(payload["explain"], q["query_id"])
            # the served setting replays to the response it came with
            served = FusionSetting.served(payload["explain"])
            assert replay(explained[q["query_id"]], served, TOP_K) == _parsed(payload), q["query_id"]
        levels, handoffs, tied, above_one = set(), 0, 0, 0
        for setting in SETTINGS:
            write_backend_config(config, corpus=demo["corpus"], index_cache=demo["cache"],
                                 overrides={**SERVED, **_overrides(setting)})
            assert client.post(f"{backend.url}/admin/reload").status_code == 200
            live, replayed = [], []
            for q in queries:
                got = _parsed(_ask(client, url, q, explain=False))
                again = replay(explained[q["query_id"]], setting, TOP_K)
                assert again == got, (setting, q["query_id"])  # ids, scores bit for bit, confidence, handoff, level
                live.append(QueryResponse(q["query_id"], "r", got, 1.0))
                replayed.append(QueryResponse(q["query_id"], "r", again, 1.0))
                levels.add(got.fallback_level)
                handoffs += got.handoff
                scores = [h.score for h in got.hits]
                tied += len(scores) - len(set(scores))
                above_one += not setting.normalize_weights and bool(scores) and max(scores) > 1.0
            a = evaluate_responses(qs, demo["qrels"], live, [])
            b = evaluate_responses(qs, demo["qrels"], replayed, [])
            metrics = [c for c in a.per_query.columns if a.per_query[c].dtype.kind == "f"]
            diff = (a.per_query[metrics] - b.per_query[metrics]).abs().max().max()
            assert diff <= 1e-9 or diff != diff, (setting, diff)  # NaN: both undefined alike (checked below)
            assert a.per_query[metrics].isna().equals(b.per_query[metrics].isna())
            assert a.metrics.keys() == b.metrics.keys()
        # the cases the settings were chosen to reach did occur
        assert {"primary", "no_filter"} <= levels and len(levels) >= 3, levels
        assert handoffs > 0 and tied > 0
        assert above_one > 0  # weights 1.0/1.0 not divided by their sum: a hit first in both sources scores 2


def test_explain_is_only_sent_when_asked_and_covers_every_date_tier(demo, tmp_path) -> None:
    config = write_backend_config(tmp_path / "config.yaml", corpus=demo["corpus"], index_cache=demo["cache"],
                                  overrides={"fallback": {"windows_days": [30, 90]}})
    temporal = next(q for q in demo["queries"] if q.get("date_hint_days") is not None)
    with start_backend(config) as backend, httpx.Client(timeout=60) as client:
        url = f"{backend.url}/search"
        plain = _ask(client, url, temporal, explain=False)
        explained = _ask(client, url, temporal, explain=True)
    assert "explain" not in plain
    assert {k: v for k, v in explained.items() if k != "explain"} == plain | {"request_id": explained["request_id"]}
    e = explained["explain"]
    # every tier a dated request tries, whichever answered, in order
    assert [t["level"] for t in e["tiers"]] == ["primary", "date_30d", "date_90d", "no_filter"]
    assert e["sources"] == ["bm25", "dense"] and e["fusion"]["method"] == "rrf"
    for tier in e["tiers"]:
        for lst in tier["sources"].values():
            assert len(lst["docs"]) == len(lst["scores"]) <= 100  # cut to the source's depth
            assert all(str(d) in e["docs"] for d in lst["docs"])
    assert {h["doc_id"] for h in plain["results"]} <= {d["doc_id"] for d in e["docs"].values()}


def test_the_batch_replay_equals_replaying_each_query_to_the_last_bit(demo, tmp_path) -> None:
    """tuner.evaluation.replay_batch (all queries in flat arrays) against ``replay`` one query
    at a time, over many settings: the same hits, scores bit for bit, grades, confidence
    and handoff; a query without an explanation stays failed."""
    from tuner.evaluation.hits import UNLABELLED
    from tuner.evaluation.replay_batch import ReplayBatch

    config = write_backend_config(tmp_path / "config.yaml", corpus=demo["corpus"], index_cache=demo["cache"],
                                  overrides={"fallback": {"windows_days": [20, 60]}})
    queries = demo["queries"]
    with start_backend(config) as backend, httpx.Client(timeout=60) as client:
        explained = {q["query_id"]: Explained.parse(_ask(client, f"{backend.url}/search", q, True)["explain"])
                     for q in queries}
    ids = [q["query_id"] for q in queries] + ["never-answered"]
    graded = [i % 7 != 0 for i in range(len(ids))]  # some queries ungraded (OOS), as a batch has
    flat = ReplayBatch(explained, ids, graded, demo["qrels"], TOP_K)
    settings = [*SETTINGS]
    for w in (0.0, 0.25, 0.5, 1.0):
        for k in (1, 4, 60, 200):
            settings.append(FusionSetting(method="rrf", weights={"bm25": w, "dense": 1 - w}, rrf_k=k, top_m=k % 9 + 1,
                                          recency_weight=w, recency_half_life_days=k + 3, min_score=w / 3))
        for norm in ("minmax", "z"):
            settings.append(FusionSetting(method="linear", weights={"bm25": w, "dense": 1 - w}, normalization=norm,
                                          confidence_threshold=0.3, top_m=8 + int(4 * w)))
    checked = handed_off = 0
    for setting in settings:
        r = flat.table(setting)
        t = r.table
        assert r.failed.tolist() == [False] * len(queries) + [True]
        assert t.counts[-1] == 0 and r.confidence[-1] == float("-inf") and not r.handoff[-1]
        for j, qid in enumerate(ids[:-1]):
            want = replay(explained[qid], setting, TOP_K)
            a, n = int(t.starts[j]), int(t.counts[j])
            assert t.docs[a:a + n] == [h.doc_id for h in want.hits], (setting, qid)
            assert np.array_equal(t.scores[a:a + n], np.array([h.score for h in want.hits])), (setting, qid)
            labels = demo["qrels"].get(qid, {}) if graded[j] else {}
            assert t.grades[a:a + n].tolist() == [labels.get(h.doc_id, UNLABELLED) for h in want.hits]
            assert r.confidence[j] == want.confidence and bool(r.handoff[j]) == want.handoff, (setting, qid)
            checked += 1
            handed_off += want.handoff
    assert checked == len(settings) * len(queries) and handed_off > 0
