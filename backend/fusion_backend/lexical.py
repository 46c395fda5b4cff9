"""The ``bm25`` source: bm25s over the shared analyzer's tokens.

bm25s precomputes per-term document scores at index time, so k1 and b are part of the
cache key; a query is a sum of a few sparse columns over the whole corpus.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import Bm25Source
from .corpus import Corpus
from .text import ANALYZER_VERSION, analyze


def cache_fields(src: Bm25Source, corpus_hash: str) -> dict[str, object]:
    return {"corpus": corpus_hash, "k1": src.k1, "b": src.b, "analyzer": ANALYZER_VERSION}


def build(corpus: Corpus, src: Bm25Source, out: Path) -> None:
    import bm25s

    retriever = bm25s.BM25(k1=src.k1, b=src.b)
    tokens = [analyze(corpus.search_text(i)) for i in range(len(corpus))]
    retriever.index(tokens, show_progress=False)
    retriever.save(str(out), show_progress=False)


class Bm25Retriever:
    """Scores every document; a document matches when it shares a term with the query."""

    def __init__(self, directory: Path, n_docs: int) -> None:
        import bm25s

        self._bm25 = bm25s.BM25.load(str(directory), mmap=False, show_progress=False)
        self._vocab: dict[str, int] = self._bm25.vocab_dict
        self._n_docs = n_docs

    def scores(self, tokens: list[str]) -> np.ndarray:
        ids = [self._vocab[t] for t in tokens if t in self._vocab]
        if not ids:
            return np.zeros(self._n_docs, dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)
