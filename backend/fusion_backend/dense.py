"""The dense space: LSA fitted on the corpus, or a sentence-transformers model.

It serves the ``dense`` source and the confidence gate (cosine of the query to the top
fused hits). Document vectors are L2-normalised, so a dot product is a cosine.

LSA is fitted with scikit-learn at build time only. Queries are embedded here with
numpy from the cached vocabulary, idf and SVD components, so a warm start never
imports scikit-learn (it costs about two seconds on these machines).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .config import ST_PREFIX, DenseSource
from .corpus import Corpus
from .text import ANALYZER_VERSION, analyze


class Embedder(Protocol):
    doc_vectors: np.ndarray  # (n_docs, dims), rows L2-normalised (or all zero)

    def embed(self, text: str) -> np.ndarray: ...


def cache_fields(src: DenseSource, corpus_hash: str) -> dict[str, object]:
    fields: dict[str, object] = {"corpus": corpus_hash, "embedder": src.embedder}
    if src.embedder == "lsa":
        fields.update(dims=src.dims, analyzer=ANALYZER_VERSION)
    return fields


def build(corpus: Corpus, src: DenseSource, out: Path) -> None:
    texts = [corpus.search_text(i) for i in range(len(corpus))]
    if src.embedder == "lsa":
        _build_lsa(texts, src.dims, out)
    else:
        model = _sentence_model(src.embedder)
        vectors = model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
        np.save(out / "doc_vectors.npy", np.asarray(vectors, dtype=np.float32))


def load(directory: Path, src: DenseSource) -> Embedder:
    if src.embedder == "lsa":
        return LsaEmbedder(directory)
    return SentenceEmbedder(directory, src.embedder)


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def _build_lsa(texts: list[str], dims: int, out: Path) -> None:
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not any(analyze(text) for text in texts):
        _write_empty_space(len(texts), out)
        return
    tfidf = TfidfVectorizer(analyzer=analyze, sublinear_tf=True, dtype=np.float32)
    matrix = tfidf.fit_transform(texts)
    # TruncatedSVD needs fewer components than terms; tiny corpora get fewer dims.
    n_components = max(1, min(dims, matrix.shape[1] - 1, matrix.shape[0] - 1))
    svd = TruncatedSVD(n_components=n_components, random_state=0)
    docs = l2_normalise(svd.fit_transform(matrix).astype(np.float32))
    vocab = sorted(tfidf.vocabulary_, key=tfidf.vocabulary_.__getitem__)
    (out / "vocab.json").write_text(json.dumps(vocab))
    np.save(out / "idf.npy", tfidf.idf_.astype(np.float32))
    np.save(out / "components.npy", svd.components_.astype(np.float32))
    np.save(out / "doc_vectors.npy", docs)


def _write_empty_space(n_docs: int, out: Path) -> None:
    """A one-dimensional all-zero space for a corpus without any term (a TREC import
    without --docs, served for its run sources only): every confidence is 0."""
    (out / "vocab.json").write_text("[]")
    np.save(out / "idf.npy", np.zeros(0, dtype=np.float32))
    np.save(out / "components.npy", np.zeros((1, 0), dtype=np.float32))
    np.save(out / "doc_vectors.npy", np.zeros((n_docs, 1), dtype=np.float32))


class LsaEmbedder:
    """TF-IDF (sublinear tf, smooth idf, L2) then the SVD projection, then L2 again."""

    def __init__(self, directory: Path) -> None:
        vocab = json.loads((directory / "vocab.json").read_text())
        self._column = {term: i for i, term in enumerate(vocab)}
        self._idf = np.load(directory / "idf.npy")
        # Column-major terms: a query touches a few terms, so slice rows of components.T.
        self._term_vectors = np.ascontiguousarray(np.load(directory / "components.npy").T)
        self.doc_vectors = np.load(directory / "doc_vectors.npy")

    def embed(self, text: str) -> np.ndarray:
        counts: dict[int, int] = {}
        for token in analyze(text):
            col = self._column.get(token)
            if col is not None:
                counts[col] = counts.get(col, 0) + 1
        dims = self._term_vectors.shape[1]
        if not counts:
            return np.zeros(dims, dtype=np.float32)
        cols = np.fromiter(counts, dtype=np.int64, count=len(counts))
        tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float32, count=len(counts)))
        weights = tf * self._idf[cols]
        weights /= np.linalg.norm(weights)
        return l2_normalise(weights @ self._term_vectors[cols])


class SentenceEmbedder:
    def __init__(self, directory: Path, embedder: str) -> None:
        self.doc_vectors = np.load(directory / "doc_vectors.npy")
        self._model = _sentence_model(embedder)

    def embed(self, text: str) -> np.ndarray:
        vec = self._model.encode([text], normalize_embeddings=True, show_progress_bar=False)[0]
        return np.asarray(vec, dtype=np.float32)


def _sentence_model(embedder: str) -> Any:  # a SentenceTransformer (an optional, untyped dependency)
    from sentence_transformers import SentenceTransformer  # optional dependency

    return SentenceTransformer(embedder.removeprefix(ST_PREFIX))
