"""Label sources: each imported label file is fingerprinted in the store, a file edited
since its import is found (judgments added / changed / removed), `--replace` re-imports
only that file, graders' grades survive it and disagreements are counted, and a label
DB written before sources existed is adopted once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tuner.data.labelfiles import Judgment
from tuner.data.labels import DeclaredSource, LabelStore, stale_labels_message
from tuner.data.qrels import GradeMap
from tuner.errors import LabelError
from tuner.ops.labelqueue import import_graded

QRELS = "q1 0 d1 2\nq1 0 d2 0\nq2 0 d3 1\n"


@pytest.fixture
def store(tmp_path: Path) -> LabelStore:
    return LabelStore(tmp_path / "labels.db")


def _qrels(tmp_path: Path, text: str = QRELS, name: str = "qrels.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_unchanged_file_is_no_change_and_its_fingerprint_is_recorded(tmp_path, store):
    import hashlib

    path = _qrels(tmp_path)
    store.import_file(path, "ds")
    (source,) = store.sources("ds")
    assert (source.kind, source.n_labels) == ("file", 3)
    assert source.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert store.source_changes("ds") == []
    assert store.source_changes("ds", [DeclaredSource(path, "qrels")]) == []
    path.write_text("q2 0 d3 1\r\n\nq1 0 d2 0\nq1 0 d1 2\n")  # other bytes, same judgments
    assert store.source_changes("ds", [DeclaredSource(path, "qrels")]) == []


def test_an_edited_file_is_counted_added_changed_removed(tmp_path, store):
    path = _qrels(tmp_path)
    store.import_file(path, "ds")
    path.write_text("q1 0 d1 3\nq2 0 d3 1\nq3 0 d4 2\nq3 0 d5 0\n")  # d1 regraded, d2 dropped, two new
    (change,) = store.source_changes("ds", [DeclaredSource(path, "qrels")])
    assert (change.added, change.changed, change.removed) == (2, 1, 1)
    assert not change.never_imported
    # an undeclared file imported with `tuner labels import` is followed as well
    assert [(c.added, c.changed, c.removed) for c in store.source_changes("ds")] == [(2, 1, 1)]
    # the cache still serves what was imported until the file is re-imported
    assert store.qrels("ds") == {"q1": {"d1": 2, "d2": 0}, "q2": {"d3": 1}}


def test_a_declared_grade_map_that_changed_is_a_change(tmp_path, store):
    path = _qrels(tmp_path, "q1 0 d1 1\nq1 0 d2 4\n")
    store.import_file(path, "ds", grade_map=GradeMap.parse("1:3,4:1"))
    assert store.source_changes("ds", [DeclaredSource(path, "qrels", GradeMap.parse("1:3,4:1"))]) == []
    (change,) = store.source_changes("ds", [DeclaredSource(path, "qrels", GradeMap.parse("1:3,4:0"))])
    assert (change.added, change.changed, change.removed) == (0, 1, 0)


def test_a_declared_file_never_imported_counts_whole(tmp_path, store):
    store.import_file(_qrels(tmp_path), "ds")
    extra = _qrels(tmp_path, "q9 0 d9 3\nq9 0 d8 1\n", "more.txt")
    (change,) = store.source_changes("ds", [DeclaredSource(tmp_path / "qrels.txt", "qrels"),
                                             DeclaredSource(extra, "qrels")])
    assert change.never_imported and change.added == 2


def test_the_message_is_one_line_with_counts_and_the_replace_command(tmp_path, store):
    path = _qrels(tmp_path)
    store.import_file(path, "ds", grade_map=GradeMap.parse("0:0,1:1,2:2"))
    path.write_text("q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 1\n")
    changes = store.source_changes("ds", [DeclaredSource(path, "qrels", GradeMap.parse("0:0,1:1,2:2"))])
    message = stale_labels_message(changes, "ds", store.path)
    assert "\n" not in message
    assert f"labels: {path} changed since it was imported into {store.path} (dataset ds): " in message
    assert "0 judgment(s) added, 1 changed, 0 removed" in message
    assert (f"`tuner labels import {path} --replace --dataset-id ds --db {store.path} --format qrels "
            "--grade-map 0:0,1:1,2:2`") in message
    assert "new study" in message


def test_a_plain_reimport_of_a_changed_file_is_refused_and_replace_replaces_only_it(tmp_path, store):
    path = _qrels(tmp_path)
    other = _qrels(tmp_path, "q1 0 d2 3\nq5 0 d5 2\n", "other.txt")
    store.import_file(path, "ds")
    store.import_file(other, "ds")  # newer: its grade of (q1, d2) is in force
    assert store.qrels("ds")["q1"] == {"d1": 2, "d2": 3}
    path.write_text("q1 0 d1 3\nq2 0 d3 1\n")  # d1 regraded, d2 dropped
    before = store.qrels("ds")
    with pytest.raises(LabelError, match=r"0 added, 1 changed, 1 removed\); pass --replace"):
        store.import_file(path, "ds")
    assert store.qrels("ds") == before  # refused: nothing written
    summary = store.import_file(path, "ds", replace=True)
    assert (summary.added, summary.changed, summary.removed) == (0, 1, 1)
    # only this file's judgments moved; the other file's are all still there
    assert store.qrels("ds") == {"q1": {"d1": 3, "d2": 3}, "q2": {"d3": 1}, "q5": {"d5": 2}}
    assert store.source_changes("ds") == []
    # the same file again unchanged imports fine without --replace
    assert store.import_file(path, "ds").n_replaced == 2


def test_replace_keeps_grader_grades_and_reports_conflicts(tmp_path, store):
    path = _qrels(tmp_path)
    store.import_file(path, "ds")
    graded = tmp_path / "queue.csv"
    graded.write_text("query_id,query,doc_id,title,best_rank,n_trials,relevance\n"
                      "q1,wing,d7,T,1,2,3\nq2,flow,d8,U,2,1,1\nq2,flow,d9,V,3,1,\n")
    summary, left = import_graded(store, graded, "ds")
    assert summary is not None and left == 1
    assert {s.kind for s in store.sources("ds")} == {"file", "grader"}
    # the file now grades a pair a grader graded (differently) and drops one it never had
    path.write_text("q1 0 d1 2\nq1 0 d2 0\nq2 0 d3 1\nq1 0 d7 0\nq2 0 d8 1\n")
    summary = store.import_file(path, "ds", replace=True)
    assert (summary.added, summary.changed, summary.removed) == (2, 0, 0)
    assert summary.n_conflicts == 1  # (q2, d8) agrees; (q1, d7) does not
    qrels = store.qrels("ds")
    assert qrels["q1"]["d7"] == 3 and qrels["q2"]["d8"] == 1  # the graders' grades are in force
    (conflict,) = store.conflicts("ds")
    assert (conflict.query_id, conflict.doc_id, conflict.file_grade, conflict.grader_grade) == ("q1", "d7", 0, 3)
    assert conflict.file_source == str(path.resolve()) and conflict.grader_source == str(graded.resolve())
    assert store.stats("ds").n_conflicts == 1
    # the file dropping every line graders also graded leaves their grades in place
    path.write_text(QRELS)
    store.import_file(path, "ds", replace=True)
    assert store.qrels("ds")["q1"]["d7"] == 3 and store.qrels("ds")["q2"]["d8"] == 1
    assert store.conflicts("ds") == []


def test_a_grader_reimport_adds_and_never_drops(tmp_path, store):
    store.import_judgments([Judgment("q1", "d1", 2)], "ds", source_file="g.csv", importer="queue-csv", kind="grader")
    store.import_judgments([Judgment("q1", "d2", 1)], "ds", source_file="g.csv", importer="queue-csv", kind="grader")
    assert store.qrels("ds") == {"q1": {"d1": 2, "d2": 1}}


def test_the_result_cache_key_follows_a_replace(tmp_path, store):
    path = _qrels(tmp_path)
    store.import_file(path, "ds")
    before = store.fingerprint("ds")
    path.write_text("q1 0 d1 3\nq1 0 d2 0\nq2 0 d3 1\n")
    assert store.fingerprint("ds") == before  # an edit alone changes nothing served (it stops runs instead)
    store.import_file(path, "ds", replace=True)
    assert store.fingerprint("ds") != before


def _legacy_db(path: Path, source: Path, sha: str) -> None:
    """A label DB as fusion-tuner wrote it before label sources: labels and imports only."""
    with sqlite3.connect(path) as con:
        con.executescript("""
            CREATE TABLE labels (dataset_id TEXT NOT NULL, query_id TEXT NOT NULL, doc_id TEXT NOT NULL,
                grade INTEGER NOT NULL CHECK (grade BETWEEN 0 AND 3), source_file TEXT NOT NULL,
                importer TEXT NOT NULL, imported_at TEXT NOT NULL,
                PRIMARY KEY (dataset_id, query_id, doc_id)) WITHOUT ROWID;
            CREATE TABLE imports (id INTEGER PRIMARY KEY, dataset_id TEXT NOT NULL, source_file TEXT NOT NULL,
                importer TEXT NOT NULL, imported_at TEXT NOT NULL, n_labels INTEGER NOT NULL, file_sha256 TEXT);
        """)
        rows = [("ds", "q1", "d1", 2), ("ds", "q1", "d2", 0), ("ds", "q2", "d3", 1)]
        con.executemany("INSERT INTO labels VALUES (?, ?, ?, ?, ?, 'qrels', '2026-01-01T00:00:00+00:00')",
                        [(*r, str(source)) for r in rows])
        con.execute("INSERT INTO labels VALUES ('ds', 'q2', 'd4', 3, '/graders/q.csv', 'queue-csv', "
                    "'2026-01-02T00:00:00+00:00')")
        con.execute("INSERT INTO imports VALUES (1, 'ds', ?, 'qrels', '2026-01-01T00:00:00+00:00', 3, ?)",
                    (str(source), sha))
        # a file whose every pair a later import overwrote: no label names it any more
        con.execute("INSERT INTO imports VALUES (2, 'ds', '/old/overwritten.txt', 'qrels', "
                    "'2025-12-01T00:00:00+00:00', 1, 'abc')")


def test_a_label_db_written_before_sources_is_adopted_once(tmp_path):
    import hashlib

    path = _qrels(tmp_path)
    db = tmp_path / "old.db"
    _legacy_db(db, path.resolve(), hashlib.sha256(path.read_bytes()).hexdigest())
    with sqlite3.connect(db) as con:
        fingerprint_rows = sorted(con.execute("SELECT query_id, doc_id, grade FROM labels"))
    store = LabelStore(db)
    assert sorted((q, d, g) for q, docs in store.qrels("ds").items() for d, g in docs.items()) == fingerprint_rows
    sources = {s.source_file: s for s in store.sources("ds")}
    assert sources[str(path.resolve())].adopted and sources[str(path.resolve())].kind == "file"
    assert sources["/graders/q.csv"].kind == "grader"
    assert (sources["/old/overwritten.txt"].n_labels, sources["/old/overwritten.txt"].file_sha256) == (0, "abc")
    assert store.source_changes("ds", [DeclaredSource(path, "qrels")]) == []  # same bytes as recorded
    LabelStore(db)  # opening again adopts nothing twice
    assert len(store.sources("ds")) == 3 and sum(s.n_labels for s in store.sources("ds")) == 4
    path.write_text("q1 0 d1 2\nq2 0 d3 1\n")
    (change,) = store.source_changes("ds", [DeclaredSource(path, "qrels")])
    assert (change.removed, change.adopted) == (1, True)
    assert "written before label sources were recorded" in stale_labels_message([change], "ds", db)
    store.import_file(path, "ds", replace=True)
    assert store.qrels("ds") == {"q1": {"d1": 2}, "q2": {"d3": 1, "d4": 3}}
