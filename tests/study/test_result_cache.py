"""The result cache's key parts: the base key (config, queries, labels, evaluation) and
the data fingerprints (declared inputs, the backend's), and the reason a miss gives."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tuner.data.inputs import InputsFingerprint
from tuner.study.storage.result_cache import CachedResult, CacheKey, ResultCache, cache_key

BASE = cache_key({"config.yaml": "x: 1\n"}, dataset_hash="d", labels_fingerprint="l", eval_spec_json="{}")
CORPUS_A = InputsFingerprint({"data/corpus.jsonl": "a" * 64, "data/runs/bm25.run": "r" * 64})
CORPUS_B = InputsFingerprint({"data/corpus.jsonl": "b" * 64, "data/runs/bm25.run": "r" * 64})
RESULT = CachedResult({"Primary_Metric_Score": 0.5}, {"json": "/r.json"}, 3, "s")


def test_without_data_fingerprints_the_key_is_the_base_key() -> None:
    assert CacheKey(BASE).key == BASE  # caches written before the fingerprints still hit
    keys = {CacheKey(BASE, CORPUS_A).key, CacheKey(BASE, CORPUS_B).key, CacheKey(BASE, None, "f1").key,
            CacheKey(BASE, CORPUS_A, "f1").key, CacheKey(BASE, CORPUS_A, "f2").key, BASE}
    assert len(keys) == 6
    # An undeclared part never equals a declared one, whatever its text.
    assert CacheKey(BASE, CORPUS_A, None).key != CacheKey(BASE, CORPUS_A, "None").key
    assert CacheKey(BASE, CORPUS_A).key == CacheKey(BASE, InputsFingerprint(dict(reversed(CORPUS_A.files.items())))).key


def test_a_miss_names_the_changed_input_files_and_the_backend_fingerprint(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "c.sqlite")
    assert cache.explain_miss(CacheKey(BASE, CORPUS_A)) == "cache miss: no result stored for this config and evaluation"
    cache.put(CacheKey(BASE, CORPUS_A, "3f2a9c01b7de44aa"), RESULT)
    assert cache.get(CacheKey(BASE, CORPUS_A, "3f2a9c01b7de44aa")) == RESULT
    assert cache.get(CacheKey(BASE, CORPUS_B, "3f2a9c01b7de44aa")) is None

    since = " since trial #3 of study s"
    assert cache.explain_miss(CacheKey(BASE, CORPUS_B, "3f2a9c01b7de44aa")) == \
        "cache miss: target.inputs changed (data/corpus.jsonl)" + since
    assert cache.explain_miss(CacheKey(BASE, CORPUS_A, "91c0aa5e27f4bb0011")) == \
        "cache miss: backend fingerprint changed (3f2a9c01b7de44aa -> 91c0aa5e27f4...)" + since
    more = InputsFingerprint({"data/corpus.jsonl": "c" * 64, "data/new.jsonl": "n" * 64})
    assert cache.explain_miss(CacheKey(BASE, more, "x")) == (
        "cache miss: target.inputs changed (data/corpus.jsonl, data/new.jsonl (new), data/runs/bm25.run (gone));"
        " backend fingerprint changed (3f2a9c01b7de44aa -> x)" + since)
    assert cache.explain_miss(CacheKey(BASE)) == (
        "cache miss: target.inputs are no longer declared; target.health.fingerprint is no longer declared" + since)
    # Another config: nothing stored for it.
    other = cache_key({"config.yaml": "x: 2\n"}, dataset_hash="d", labels_fingerprint="l", eval_spec_json="{}")
    assert cache.explain_miss(CacheKey(other, CORPUS_B)).endswith("no result stored for this config and evaluation")


def test_a_cache_written_before_the_fingerprints_is_migrated_and_still_hits(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE results (key TEXT PRIMARY KEY, metrics TEXT NOT NULL, reports TEXT NOT NULL,"
                     " source_trial INTEGER, study_name TEXT, created REAL NOT NULL)")
        conn.execute("INSERT INTO results VALUES (?, '{\"m\": 1.0}', '{}', 7, 'old', 0)", (BASE,))
    conn.close()
    cache = ResultCache(path)
    assert cache.get(BASE) == CachedResult({"m": 1.0}, {}, 7, "old")
    assert cache.explain_miss(CacheKey(BASE, CORPUS_A)) == (
        "cache miss: target.inputs newly declared since trial #7 of study old")
    ResultCache(path)  # opening a migrated cache again changes nothing
    assert len(ResultCache(path)) == 1


def test_a_change_of_the_scoring_rules_changes_every_key(monkeypatch) -> None:
    """Results scored under older rules (before repeats were removed from live answers)
    must miss, not answer for the rules now."""
    import tuner.study.storage.result_cache as rc

    def key() -> str:
        return cache_key({"config.yaml": "x: 1\n"}, dataset_hash="d", labels_fingerprint="l", eval_spec_json="{}")

    now = key()
    monkeypatch.setattr(rc, "SCORING_RULES", "1")
    assert key() != now
