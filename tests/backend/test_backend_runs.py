"""Run sources (TREC run files looked up by query_id) and the search core without HTTP."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from backend_testdata import NOW, write_corpus
from fusion_backend.config import load_config
from fusion_backend.corpus import read_corpus
from fusion_backend.errors import CorpusError
from fusion_backend.index import load_index
from fusion_backend.runs import read_run
from fusion_backend.search import Searcher, SearchRequest
from support.backend import start_backend, write_backend_config

RUN = """q1 Q0 d14 1 9.5 splade
q1 Q0 d05 2 7.0 splade
q1 Q0 ghost 3 6.0 splade
q1 Q0 d11 4 7.0 splade
q2 Q0 d01 1 1.0 splade
"""

RUN_CONFIG = {
    "data": {"runs": {"splade": "run.trec"}},
    "sources": {"splade": {"type": "run", "depth": 10}},
    "fusion": {"weights": {"bm25": 0.0, "dense": 0.0, "splade": 1.0}},
}


@pytest.fixture()
def run_config(tmp_path: Path) -> Path:
    (tmp_path / "run.trec").write_text(RUN)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    return write_backend_config(tmp_path / "config.yaml", corpus=corpus, overrides=RUN_CONFIG)


def test_run_file_order_is_score_desc_then_docno_desc(tmp_path: Path) -> None:
    corpus = read_corpus(write_corpus(tmp_path / "corpus.jsonl"))
    (tmp_path / "run.trec").write_text(RUN)
    table = read_run(tmp_path / "run.trec", corpus.index_of())
    docs, scores = table.lookup("q1")
    assert [corpus.doc_ids[d] for d in docs] == ["d14", "d11", "d05"]  # 7.0 tie: d11 > d05
    assert scores.tolist() == [9.5, 7.0, 7.0]
    assert table.dropped == 1
    assert table.lookup("unknown")[0].size == 0 and table.lookup(None)[0].size == 0


def test_malformed_run_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.trec").write_text("q1 Q0 d1 1 2.0 tag\nq1 Q0 d2 2\n")
    with pytest.raises(CorpusError, match=r"bad\.trec:2: a TREC run line has 6 columns"):
        read_run(tmp_path / "bad.trec", {"d1": 0, "d2": 1})


def test_searcher_fuses_the_run_for_the_query_id(run_config: Path) -> None:
    cfg = load_config(run_config)
    searcher = Searcher(load_index(cfg), cfg)
    now = dt.date.fromisoformat(NOW)
    outcome = searcher.search(SearchRequest(query="anything at all", query_id="q1", now=now))
    assert [h.doc_id for h in outcome.hits] == ["d14", "d11", "d05"]
    k = cfg.fusion.rrf_k
    assert [h.score for h in outcome.hits] == pytest.approx([(k + 1) / (k + r) for r in (1, 2, 3)])
    assert [h.sub_scores["splade"] for h in outcome.hits] == [9.5, 7.0, 7.0]
    without_id = searcher.search(SearchRequest(query="anything", now=now))
    assert without_id.fallback_level == "empty" and without_id.handoff
    # The reason says what the user forgot: the run source is looked up by query_id.
    assert without_id.handoff_reason == "no candidates (run sources splade need the request's query_id)"
    unknown = searcher.search(SearchRequest(query="anything", query_id="q9", now=now))
    assert unknown.handoff_reason == "no candidates (no run source ranks query_id 'q9')"
    dated = searcher.search(SearchRequest(query="x", query_id="q1", now=now, date_hint_days=400))
    assert dated.fallback_level == "primary" and [h.doc_id for h in dated.hits] == ["d11"]


def test_service_reads_query_id_from_the_request(run_config: Path) -> None:
    with start_backend(run_config) as backend:
        body = backend.search({"query": "anything", "query_id": "q2", "now": NOW}).json()
        assert [r["doc_id"] for r in body["results"]] == ["d01"]
        numeric = backend.search({"query": "anything", "query_id": 2, "now": NOW}).json()
        assert numeric["fallback_level"] == "empty"  # "2" is not "q2"
        assert numeric["handoff_reason"] == "no candidates (no run source ranks query_id '2')"
