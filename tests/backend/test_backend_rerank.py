"""rerank.depth: the top hits re-read from their text and re-scored by query-term coverage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_testdata import DOCS, corpus_path, ids, search, shared_cache  # noqa: F401  (fixtures)
from support.backend import RunningBackend, start_backend, write_backend_config

from fusion_backend.text import analyze
from tuner.errors import ResponseMappingError
from tuner.evaluation.fusion_replay import Explained

TEXT = {d["doc_id"]: f"{d['title']}\n{d['text']}" for d in DOCS}
QUERY = "green velvet sofa"


def coverage(doc_id: str) -> float:
    terms = set(analyze(QUERY))
    return len(terms.intersection(analyze(TEXT[doc_id]))) / len(terms)


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory,
    corpus_path: Path,  # noqa: F811
    shared_cache: Path,  # noqa: F811
) -> Iterator[tuple[RunningBackend, RunningBackend]]:
    root = tmp_path_factory.mktemp("rerank")
    plain = write_backend_config(root / "plain.yaml", corpus=corpus_path, index_cache=shared_cache)
    reranked = write_backend_config(
        root / "rerank.yaml",
        corpus=corpus_path,
        index_cache=shared_cache,
        overrides={"rerank": {"depth": 50, "weight": 1.0}},
    )
    with start_backend(plain, timeout=90) as a, start_backend(reranked, timeout=90) as b:
        yield a, b


def test_a_full_weight_rerank_orders_hits_by_query_term_coverage(pair: tuple[RunningBackend, RunningBackend]) -> None:
    plain, reranked = pair
    before, after = ids(search(plain, QUERY)), ids(search(reranked, QUERY))
    assert sorted(before) == sorted(after)  # the same hits, read again
    covered = [coverage(d) for d in after]
    assert covered == sorted(covered, reverse=True) and covered[0] == 1.0  # d13: green velvet ... sofa
    assert [h["score"] for h in search(reranked, QUERY)["results"]] == pytest.approx(covered)
    assert [h["score"] for h in search(plain, QUERY)["results"]] != pytest.approx([coverage(d) for d in before])


def test_only_an_explained_rerank_names_itself_and_fusion_replay_refuses_it(
    pair: tuple[RunningBackend, RunningBackend],
) -> None:
    plain, reranked = pair
    assert "rerank" not in search(plain, QUERY, explain=True)["explain"]
    explain = search(reranked, QUERY, explain=True)["explain"]
    assert explain["rerank"] == {"depth": 50, "weight": 1.0}
    Explained.parse(search(plain, QUERY, explain=True)["explain"], "q1")
    with pytest.raises(
        ResponseMappingError, match=r"query q1: the backend reranks .*rerank\.depth 50.*rerank\.depth: 0"
    ):
        Explained.parse(explain, "q1")
