"""A coarse grid over the reference service on the demo data (used by test_demo_meaningful).

Every retrieval setting (fusion method, RRF k, weight share, fallback windows) is a
real service process started from a config file; the confidence threshold is swept on
the client from the confidence each response reports (the gate does not change the
ranking, so one run per retrieval setting serves every threshold).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from support.backend import start_backend, write_backend_config

from tuner.metrics import score_rankings

TOP_K = 50
SERVER_THRESHOLD = 0.3  # the gate the processes run with; checked against client-side gating
REQUEST_FIELDS = ("date_hint_days", "now")


@dataclass(frozen=True)
class Setting:
    """One retrieval setting of the grid."""

    name: str
    bm25_share: float
    method: str = "rrf"
    rrf_k: int = 60
    windows: tuple[int, ...] = (30, 90)

    def overrides(self) -> dict[str, Any]:
        return {
            "fusion": {"method": self.method, "rrf_k": self.rrf_k,
                       "weights": {"bm25": self.bm25_share, "dense": round(1 - self.bm25_share, 4)}},
            "confidence": {"threshold": SERVER_THRESHOLD},
            "fallback": {"windows_days": list(self.windows)},
        }


@dataclass
class Responses:
    """What the service returned for every query under one setting."""

    rankings: dict[str, list[str]]
    confidence: dict[str, float]
    handoff: dict[str, bool]
    fallback_level: dict[str, str]


@dataclass
class DemoData:
    queries: list[dict[str, Any]]
    qrels: dict[str, dict[str, int]]
    in_scope: list[str] = field(init=False)
    oos: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.in_scope = [q["query_id"] for q in self.queries if q["scope"] == "in"]
        self.oos = [q["query_id"] for q in self.queries if q["scope"] == "oos"]

    @classmethod
    def read(cls, folder: Path) -> DemoData:
        queries = [json.loads(line) for line in (folder / "queries.jsonl").open()]
        qrels: dict[str, dict[str, int]] = {}
        for line in (folder / "qrels.txt").open():
            qid, _, doc, grade = line.split()
            qrels.setdefault(qid, {})[doc] = int(grade)
        return cls(queries, qrels)


def run_setting(setting: Setting, data: DemoData, corpus: Path, workdir: Path, index_cache: Path) -> Responses:
    config = write_backend_config(workdir / f"{setting.name}.yaml", corpus=corpus, index_cache=index_cache,
                                  overrides=setting.overrides())
    with start_backend(config, timeout=120) as backend, httpx.Client(base_url=backend.url, timeout=30) as client:
        def ask(query: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
            body = {"query": query["query"], "top_k": TOP_K, **{k: query[k] for k in REQUEST_FIELDS if k in query}}
            response = client.post("/search", json=body)
            response.raise_for_status()
            return query["query_id"], response.json()

        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = dict(pool.map(ask, data.queries))
    return Responses(
        rankings={q: [hit["doc_id"] for hit in a["results"]] for q, a in answers.items()},
        confidence={q: float(a["confidence"]) for q, a in answers.items()},
        handoff={q: bool(a["handoff"]) for q, a in answers.items()},
        fallback_level={q: a["fallback_level"] for q, a in answers.items()},
    )


def answered(responses: Responses, query_id: str, threshold: float) -> bool:
    """The service's gate, replayed for another threshold: answer when confident and non-empty."""
    return responses.confidence[query_id] >= threshold and bool(responses.rankings[query_id])


def primary_score(responses: Responses, data: DemoData, threshold: float) -> float:
    """Mean Primary_Metric_Score over in-scope queries; a handed-off query scores 0."""
    rankings = {q: responses.rankings[q] if answered(responses, q, threshold) else [] for q in data.in_scope}
    frame = score_rankings(rankings, data.qrels, data.in_scope, gains="linear")
    return float(frame["Primary_Metric_Score"].mean())


def oos_fp_rate(responses: Responses, data: DemoData, threshold: float) -> float:
    """Share of out-of-scope queries the service would answer instead of handing off."""
    return float(np.mean([answered(responses, q, threshold) for q in data.oos]))


@dataclass(frozen=True)
class Point:
    setting: Setting
    threshold: float
    score: float
    fp_rate: float


def sweep(setting: Setting, responses: Responses, data: DemoData, thresholds: Iterable[float]) -> list[Point]:
    return [Point(setting, t, primary_score(responses, data, t), oos_fp_rate(responses, data, t)) for t in thresholds]
