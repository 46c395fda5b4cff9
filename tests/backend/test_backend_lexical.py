"""The BM25 source: bm25s builds the index; serving reads it with numpy alone.

``Bm25Retriever`` sums a query's columns of the saved index itself instead of loading it
through bm25s (whose import pulls in numba and scipy.sparse: a third of a backend's start
CPU). These tests hold its scores bit-equal to bm25s's own ``get_scores_from_ids`` on
the index bm25s saved, and a start free of those imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from backend_testdata import DOCS, write_corpus
from fusion_backend import lexical
from fusion_backend.config import Bm25Source
from fusion_backend.corpus import read_corpus
from fusion_backend.errors import IndexBuildError
from fusion_backend.text import analyze
from support.demo_data import copy_demo_data

QUERIES = ("leather sofa living room", "lamp lamp brass", "porch", "zzz qqq", "", "sofa zzz sofa couch velvet green")


def built(tmp_path: Path, corpus_path: Path, **params: float) -> Path:
    out = tmp_path / "bm25"
    out.mkdir()
    lexical.build(read_corpus(corpus_path), Bm25Source(type="bm25", **params), out)
    return out


def assert_scores_as_bm25s(directory: Path, n_docs: int, queries: list[str]) -> None:
    import bm25s

    theirs = bm25s.BM25.load(str(directory), mmap=False, show_progress=False)
    ours = lexical.Bm25Retriever(directory, n_docs)
    for query in queries:
        tokens = analyze(query)
        ids = [theirs.vocab_dict[t] for t in tokens if t in theirs.vocab_dict]
        expected = theirs.get_scores_from_ids(ids) if ids else np.zeros(n_docs, dtype=np.float32)
        got = ours.scores(tokens)
        assert got.dtype == expected.dtype and got.shape == (n_docs,), query
        assert np.array_equal(got, expected), query  # bit for bit: the same float32 sums in the same order


@pytest.mark.parametrize("params", [{}, {"k1": 0.9, "b": 0.3}])
def test_scores_equal_bm25s_on_the_furniture_corpus(tmp_path: Path, params: dict[str, float]) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    assert_scores_as_bm25s(built(tmp_path, corpus, **params), len(DOCS), list(QUERIES))


def test_scores_equal_bm25s_on_the_demo_corpus_and_queries(tmp_path: Path) -> None:
    data = copy_demo_data(tmp_path / "data")
    corpus = read_corpus(data / "corpus.jsonl")
    queries = [json.loads(line)["query"] for line in (data / "queries.jsonl").read_text().splitlines() if line]
    assert len(queries) > 50
    assert_scores_as_bm25s(built(tmp_path, data / "corpus.jsonl"), len(corpus), queries[:200])


def test_an_index_of_a_method_it_does_not_score_is_refused(tmp_path: Path) -> None:
    directory = built(tmp_path, write_corpus(tmp_path / "corpus.jsonl"))
    params = json.loads((directory / "params.index.json").read_text())
    (directory / "params.index.json").write_text(json.dumps({**params, "method": "bm25+"}))
    with pytest.raises(IndexBuildError, match=r"method bm25\+.*delete the directory to rebuild it"):
        lexical.Bm25Retriever(directory, len(DOCS))


# Load a built index (dense and BM25, both from the cache) in a fresh interpreter and
# list the heavy libraries it imported.
LOAD_PROBE = """
import json, sys
from fusion_backend.config import load_config
from fusion_backend.index import load_index
index = load_index(load_config(sys.argv[1]))
assert all(index.cache_hits.values()), index.cache_hits
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_a_warm_start_imports_neither_bm25s_nor_numba_scipy_or_scikit_learn(tmp_path: Path) -> None:
    from fusion_backend.config import load_config
    from fusion_backend.index import load_index
    from support.backend import write_backend_config

    config = write_backend_config(tmp_path / "config.yaml", corpus=write_corpus(tmp_path / "corpus.jsonl"))
    load_index(load_config(config))  # builds (or finds) both components
    done = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(config)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    packages = set(json.loads(done.stdout.splitlines()[-1]))
    assert "numpy" in packages
    assert packages & {"bm25s", "numba", "scipy", "sklearn"} == set()
