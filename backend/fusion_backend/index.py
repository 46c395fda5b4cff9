"""Loading the search index: corpus, cached source components, run files.

Each component is cached under ``data.index_cache`` keyed by the corpus content hash
plus the settings it depends on (BM25: k1, b; dense: embedder, dims), so restarting
with different fusion, threshold, depth or enabled keys reuses everything and changing
k1 rebuilds only BM25. Run files are small and read on every start.
$FUSION_BACKEND_INDEX_CACHE, when set, names the cache directory instead of
``data.index_cache``: the cache is content-addressed, so one directory can serve every
config of a machine (the test suite shares one across all the backends it starts).

``index_signature`` names everything ``load_index`` reads: a reload whose signature is
unchanged keeps the loaded index and only builds a new searcher over it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import dense, lexical
from .config import Bm25Source, Config, DenseSource, RunSource
from .corpus import Corpus, read_corpus
from .dense import Embedder
from .index_cache import cached_component
from .lexical import Bm25Retriever
from .runs import RunTable, read_run

log = logging.getLogger("fusion_backend")

INDEX_CACHE_ENV = "FUSION_BACKEND_INDEX_CACHE"


@dataclass(frozen=True)
class DocMeta:
    """What a search needs per document once the index is built (texts dropped)."""

    doc_ids: list[str]
    titles: list[str]
    dates: list[str | None]
    days: np.ndarray
    content_hash: str
    # title + text of each document: only a rerank (rerank.depth > 0) reads them again
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.doc_ids)


@dataclass
class SearchIndex:
    docs: DocMeta
    embedder: Embedder
    bm25: dict[str, Bm25Retriever] = field(default_factory=dict)
    runs: dict[str, RunTable] = field(default_factory=dict)
    cache_hits: dict[str, bool] = field(default_factory=dict)
    load_seconds: float = 0.0


def load_index(cfg: Config) -> SearchIndex:
    """Build or load every component ``cfg`` needs; raises CorpusError / IndexBuildError."""
    started = time.perf_counter()
    corpus = read_corpus(cfg.data.corpus)
    cache = cache_dir(cfg)
    hits: dict[str, bool] = {}

    dense_name, dense_src = cfg.dense_source()
    directory, hits[dense_name] = _component(
        cache,
        "dense",
        dense.cache_fields(dense_src, corpus.content_hash),
        lambda out: dense.build(corpus, dense_src, out),
    )
    embedder = dense.load(directory, dense_src)

    bm25: dict[str, Bm25Retriever] = {}
    runs: dict[str, RunTable] = {}
    doc_index = None
    for name, src in cfg.sources.items():
        if isinstance(src, Bm25Source) and src.enabled:
            directory, hits[name] = _component(
                cache,
                "bm25",
                lexical.cache_fields(src, corpus.content_hash),
                functools.partial(lexical.build, corpus, src),
            )
            bm25[name] = Bm25Retriever(directory, len(corpus))
        elif isinstance(src, RunSource) and src.enabled:
            doc_index = doc_index or {d: i for i, d in enumerate(corpus.doc_ids)}
            runs[name] = read_run(cfg.run_path(name), doc_index)
            if runs[name].dropped:
                log.warning(
                    "run source %s: %d lines name documents absent from the corpus; ignored", name, runs[name].dropped
                )
        elif isinstance(src, DenseSource):
            pass  # loaded above: it is also the confidence space
    docs = _meta(corpus)
    return SearchIndex(docs, embedder, bm25, runs, hits, time.perf_counter() - started)


def index_signature(cfg: Config) -> str:
    """What :func:`load_index` depends on, as one string: the corpus (path and file
    identity), the cache directory, the dense source's name and cache fields, each
    enabled BM25 source's name and cache fields, each enabled run source's name and
    file. Keep it in step with ``load_index``: equal signatures load equal indexes."""
    body: dict[str, object] = {"corpus": _file_identity(cfg.data.corpus), "cache": str(cache_dir(cfg))}
    dense_name, dense_src = cfg.dense_source()
    body["dense"] = [dense_name, dense.cache_fields(dense_src, corpus_hash="")]
    body["bm25"] = {
        n: lexical.cache_fields(s, corpus_hash="")
        for n, s in cfg.sources.items()
        if isinstance(s, Bm25Source) and s.enabled
    }
    body["runs"] = {
        n: _file_identity(cfg.run_path(n)) for n, s in cfg.sources.items() if isinstance(s, RunSource) and s.enabled
    }
    return json.dumps(body, sort_keys=True)


def cache_dir(cfg: Config) -> Path:
    """Where the index components live: $FUSION_BACKEND_INDEX_CACHE when set (non-empty),
    else ``data.index_cache``. An environment setting, not a config key, so the config's
    hash and fingerprint do not depend on the machine's cache location."""
    override = os.environ.get(INDEX_CACHE_ENV)
    return Path(override).resolve() if override else cfg.data.index_cache


def _file_identity(path: Path) -> list[object]:
    """Path, size and mtime: a file rewritten in place (regenerated data) counts as changed."""
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _component(cache: Path, kind: str, fields: dict[str, object], build: Callable[[Path], None]) -> tuple[Path, bool]:
    t0 = time.perf_counter()
    directory, hit = cached_component(cache, kind, fields, build)
    log.info(
        "%s index %s in %.2f s (%s)",
        kind,
        "loaded from cache" if hit else "built",
        time.perf_counter() - t0,
        directory.name,
    )
    return directory, hit


def _meta(corpus: Corpus) -> DocMeta:
    return DocMeta(
        corpus.doc_ids,
        corpus.titles,
        corpus.dates,
        corpus.days,
        corpus.content_hash,
        [corpus.search_text(i) for i in range(len(corpus.doc_ids))],
    )
