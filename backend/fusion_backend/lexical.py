"""The ``bm25`` source: bm25s over the shared analyzer's tokens.

bm25s precomputes per-term document scores at index time, so k1 and b are part of the
cache key; a query is a sum of a few sparse columns over the whole corpus.

bm25s builds the index (cached); serving reads the saved index with numpy alone and sums
the query's columns the way bm25s's ``get_scores_from_ids`` does, bit for bit
(tests/backend/test_lexical.py holds the two equal). Importing bm25s imports numba and
scipy.sparse whenever they are installed, about 0.35 s of CPU at every start for
functions a saved index does not use (like the dense space, which never imports
scikit-learn on a warm start).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .config import Bm25Source
from .corpus import Corpus
from .errors import IndexBuildError
from .text import ANALYZER_VERSION, analyze


def cache_fields(src: Bm25Source, corpus_hash: str) -> dict[str, object]:
    return {"corpus": corpus_hash, "k1": src.k1, "b": src.b, "analyzer": ANALYZER_VERSION}


def build(corpus: Corpus, src: Bm25Source, out: Path) -> None:
    import bm25s

    retriever = bm25s.BM25(k1=src.k1, b=src.b)
    tokens = [analyze(corpus.search_text(i)) for i in range(len(corpus))]
    retriever.index(tokens, show_progress=False)
    retriever.save(str(out), show_progress=False)


# What bm25s's ``BM25.save`` writes (and ``BM25.load`` reads): the per-term document
# scores as a CSC matrix (one column per term), the vocabulary and the parameters.
_DATA, _INDICES, _INDPTR = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
_VOCAB, _PARAMS = "vocab.index.json", "params.index.json"
# BM25 variants whose score also adds a per-term constant to documents without the term
# (a nonoccurrence array): `build` never makes them (bm25s' default, lucene).
_NONOCCURRENCE_METHODS = ("bm25l", "bm25+")


class Bm25Retriever:
    """Scores every document; a document matches when it shares a term with the query."""

    def __init__(self, directory: Path, n_docs: int) -> None:
        directory = Path(directory)
        params = json.loads((directory / _PARAMS).read_text(encoding="utf-8"))
        if params.get("method") in _NONOCCURRENCE_METHODS:
            raise IndexBuildError(
                f"data.index_cache: {directory} holds a BM25 index of method {params['method']}, which this "
                "backend does not score; delete the directory to rebuild it"
            )
        self._vocab: dict[str, int] = json.loads((directory / _VOCAB).read_text(encoding="utf-8"))
        self._data = np.load(directory / _DATA, allow_pickle=False)
        self._indices = np.load(directory / _INDICES, allow_pickle=False)
        self._indptr = np.load(directory / _INDPTR, allow_pickle=False)
        self._dtype = np.dtype(params.get("dtype", "float32"))
        self._n_docs = n_docs

    def scores(self, tokens: list[str]) -> np.ndarray:
        ids = [self._vocab[t] for t in tokens if t in self._vocab]
        scores = np.zeros(self._n_docs, dtype=self._dtype if ids else np.float32)
        # bm25s's get_scores_from_ids: each query term's column added in query order
        # (np.add.at, so a repeated term counts twice and float32 sums round the same)
        for term in ids:
            start, end = self._indptr[term], self._indptr[term + 1]
            np.add.at(scores, self._indices[start:end], self._data[start:end])
        return scores
