"""Index building and the on-disk cache (atomic publish, reuse, concurrent builders)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from backend_testdata import DOCS, write_corpus
from fusion_backend.config import load_config
from fusion_backend.corpus import read_corpus
from fusion_backend.errors import CorpusError
from fusion_backend.index import INDEX_CACHE_ENV, load_index
from fusion_backend.index_cache import STALE_TMP_SECONDS, cached_component
from fusion_backend.text import analyze
from support.backend import write_backend_config


def test_lsa_query_embedding_matches_scikit_learn_pipeline(tmp_path: Path) -> None:
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    cfg = load_config(write_backend_config(tmp_path / "config.yaml", corpus=corpus,
                                           overrides={"sources": {"dense": {"dims": 5}}}))
    index = load_index(cfg)
    texts = [f"{d['title']}\n{d['text']}" for d in DOCS]
    tfidf = TfidfVectorizer(analyzer=analyze, sublinear_tf=True)
    svd = TruncatedSVD(n_components=5, random_state=0).fit(tfidf.fit_transform(texts))
    for query in ("leather sofa living room", "lamp lamp brass", "porch"):
        expected = svd.transform(tfidf.transform([query]))[0]
        expected /= np.linalg.norm(expected)
        got = index.embedder.embed(query)
        # SVD components are defined up to sign; the fit is seeded, so signs agree.
        assert got == pytest.approx(expected, abs=1e-5)
    assert np.linalg.norm(index.embedder.doc_vectors, axis=1) == pytest.approx(np.ones(len(DOCS)), abs=1e-5)
    assert not index.embedder.embed("zzz qqq").any()


def test_second_load_hits_the_cache_and_k1_rebuilds_only_bm25(tmp_path: Path, own_index_cache: None) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    cache = tmp_path / "cache"
    first = load_index(load_config(write_backend_config(tmp_path / "a.yaml", corpus=corpus, index_cache=cache)))
    assert first.cache_hits == {"dense": False, "bm25": False}
    tuned = {"fusion": {"method": "linear", "rrf_k": 5}, "confidence": {"threshold": 0.1},
             "sources": {"bm25": {"depth": 3}, "dense": {"min_similarity": 0.2}}}
    again = load_index(load_config(write_backend_config(tmp_path / "b.yaml", corpus=corpus, index_cache=cache,
                                                        overrides=tuned)))
    assert again.cache_hits == {"dense": True, "bm25": True}
    k1 = load_index(load_config(write_backend_config(tmp_path / "c.yaml", corpus=corpus, index_cache=cache,
                                                     overrides={"sources": {"bm25": {"k1": 0.9}}})))
    assert k1.cache_hits == {"dense": True, "bm25": False}
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == ["bm25", "bm25", "dense"]


def test_changed_corpus_gets_a_new_index(tmp_path: Path, own_index_cache: None) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    path = write_backend_config(tmp_path / "a.yaml", corpus=corpus)
    load_index(load_config(path))
    write_corpus(corpus, DOCS[:-1])
    index = load_index(load_config(path))
    assert index.cache_hits == {"dense": False, "bm25": False}
    assert len(index.docs) == len(DOCS) - 1


def test_the_environment_names_the_cache_instead_of_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One cache for every config of a machine (the test suite's): the config's own
    # data.index_cache stays empty, a second config with another cache path hits.
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    monkeypatch.setenv(INDEX_CACHE_ENV, str(tmp_path / "machine-cache"))
    first = load_index(load_config(write_backend_config(tmp_path / "a.yaml", corpus=corpus, index_cache=tmp_path / "a")))
    second = load_index(load_config(write_backend_config(tmp_path / "b.yaml", corpus=corpus, index_cache=tmp_path / "b")))
    assert first.cache_hits == {"dense": False, "bm25": False} and second.cache_hits == {"dense": True, "bm25": True}
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "machine-cache").iterdir()) == ["bm25", "dense"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_concurrent_builders_publish_one_directory(tmp_path: Path) -> None:
    builds: list[int] = []
    barrier = threading.Barrier(4)

    def build(out: Path) -> None:
        barrier.wait()  # everyone is past the "not cached yet" check
        (out / "payload.txt").write_text(str(threading.get_ident()))
        builds.append(1)
        time.sleep(0.05)

    results: list[tuple[Path, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(cached_component(tmp_path, "x", {"a": 1}, build)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 4 and len({r[0] for r in results}) == 1
    directory = results[0][0]
    assert json.loads((directory / "meta.json").read_text())["a"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [directory.name]  # no temp dirs left
    assert cached_component(tmp_path, "x", {"a": 1}, build) == (directory, True)


def test_failed_build_leaves_nothing_and_stale_temp_dirs_are_swept(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-x-abandoned"
    stale.mkdir()
    old = time.time() - STALE_TMP_SECONDS - 10
    os.utime(stale, (old, old))

    def broken(out: Path) -> None:
        (out / "half").write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cached_component(tmp_path, "x", {"a": 2}, broken)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("line", "message"), [
    ('{"doc_id": "a", "title": "t", "text": "x", "date": "2024-13-01"}', "date '2024-13-01' is not YYYY-MM-DD"),
    ('not json', "not a JSON object"),
    ('{"title": "t"}', "doc_id is missing"),
])
def test_corpus_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"doc_id": "ok", "title": "t", "text": "x", "date": null}\n' + line + "\n")
    with pytest.raises(CorpusError, match=rf"^{path}:2: .*{message}"):
        read_corpus(path)


def test_duplicate_doc_ids_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"doc_id": "a", "title": "t"}\n{"doc_id": "a", "title": "u"}\n')
    with pytest.raises(CorpusError, match="duplicate doc_id 'a'"):
        read_corpus(path)
