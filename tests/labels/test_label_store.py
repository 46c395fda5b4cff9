import csv
import json
import sqlite3

import pytest

from tuner.data.labelfiles import Judgment, read_judgments
from tuner.data.labels import LabelStore
from tuner.data.qrels import CRANFIELD, GradeMap
from tuner.data.unjudged import export_unjudged, unjudged_pairs
from tuner.errors import InputError, LabelError


@pytest.fixture
def store(tmp_path):
    return LabelStore(tmp_path / "labels.db")


def _rows(db_path):
    with sqlite3.connect(db_path) as con:
        return sorted(con.execute("SELECT dataset_id, query_id, doc_id, grade, importer FROM labels"))


def test_import_each_format_gives_same_qrels(tmp_path, store):
    (tmp_path / "a.qrels").write_text("q1 0 d1 3\nq1 0 d2 0\r\nq2 0 d3 2\n")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"query_id": "q1", "judgments": [{"doc_id": "d1", "relevance": 3}, {"doc_id": "d2", "relevance": 0}]})
        + "\n" + json.dumps({"query_id": "q2", "judgments": [{"doc_id": "d3", "relevance": 2}]}) + "\n"
    )
    (tmp_path / "c.csv").write_text("query_id,doc_id,relevance,title\nq1,d1,3,A\nq1,d2,0,B\nq2,d3,2,C\n")
    expected = {"q1": {"d1": 3, "d2": 0}, "q2": {"d3": 2}}
    for name, ds in (("a.qrels", "A"), ("b.jsonl", "B"), ("c.csv", "C")):
        summary = store.import_file(tmp_path / name, ds)
        assert (summary.n_labels, summary.n_queries, summary.n_replaced) == (3, 2, 0)
        assert summary.grade_counts == {0: 1, 1: 0, 2: 1, 3: 1}
        assert store.qrels(ds) == expected
    assert store.datasets() == ["A", "B", "C"]
    # same labels -> same fingerprint whatever the importer (provenance is not part of it)
    assert store.fingerprint("A") == store.fingerprint("B") == store.fingerprint("C")
    assert {r[4] for r in _rows(store.path)} == {"qrels", "jsonl", "csv"}


def test_reimport_replaces_and_fingerprint_follows_grades(tmp_path, store):
    (tmp_path / "one.csv").write_text("query_id,doc_id,relevance\nq1,d1,1\nq1,d2,2\n")
    (tmp_path / "two.csv").write_text("query_id,doc_id,relevance\nq1,d1,3\nq1,d9,0\n")
    store.import_file(tmp_path / "one.csv", "ds")
    before = store.fingerprint("ds")
    summary = store.import_file(tmp_path / "two.csv", "ds")
    assert summary.n_replaced == 1
    assert store.qrels("ds") == {"q1": {"d1": 3, "d2": 2, "d9": 0}}
    assert store.fingerprint("ds") != before
    stats = store.stats("ds")
    assert stats.n_labels == 3 and stats.n_queries == 1
    assert stats.grade_counts == {0: 1, 1: 0, 2: 1, 3: 1}
    assert stats.per_query == {"q1": {0: 1, 1: 0, 2: 1, 3: 1}}
    assert [n for *_, n in stats.imports] == [2, 2]
    assert stats.imports[1][0].endswith("two.csv")


def test_fingerprint_is_hash_of_sorted_rows(store):
    import hashlib

    store.import_judgments([Judgment("q2", "b", 1), Judgment("q1", "z", 3), Judgment("q1", "a", 0)], "ds",
                           source_file="mem", importer="test")
    text = "q1\ta\t0\nq1\tz\t3\nq2\tb\t1\n"
    assert store.fingerprint("ds") == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "expected"),
    [
        ("bad.qrels", "q1 0 d1 1\nq1 d2\nq1 0 d3 2\n", {}, r"bad\.qrels:2: expected 'qid iter docno grade'"),
        ("bad.qrels", "q1 0 d1 1\nq1 0 d2 7\n", {}, r"bad\.qrels:2: grade 7 is not in the grade map"),
        ("bad.qrels", "q1 0 d1 1\nq1 0 d1 2\n", {}, r"bad\.qrels:2: .*judged again"),
        ("bad.jsonl", '{"query_id": "q1", "judgments": [{"doc_id": "d1", "relevance": 2}]}\n{"query_id": "q2", "judgments": [{"doc_id": "d1", "relevance": 5}]}\n', {},
         r"bad\.jsonl:2 \(judgment 1\): grade 5 is outside the grade mapping"),
        ("bad.jsonl", '{"query_id": "q1", "judgments": [{"doc_id": "d1", "relevance": 2}]}\n{"query_id": "q2"\n', {},
         r"bad\.jsonl:2: malformed JSON"),
        ("bad.jsonl", '{"query_id": "q1"}\n', {}, r"bad\.jsonl:1: missing field judgments"),
        ("bad.csv", "query_id,doc_id,relevance\nq1,d1,2\nq1,d2,high\n", {}, r"bad\.csv:3: grade 'high' is outside"),
        ("bad.csv", "query_id,doc_id,relevance\nq1,d1,2\nq1,d2,\n", {}, r"bad\.csv:3: empty relevance"),
        ("bad.csv", "query,doc,rel\nq1,d1,2\n", {}, r"bad\.csv:1: CSV header lacks query_id, doc_id, relevance"),
        ("bad.csv", "query_id,doc_id,relevance\nq1,d1,2\nq1,d1,3\n", {}, r"bad\.csv:3: \(q1, d1\) graded 3 but 2 at line 2"),
        ("cran.qrels", "1 184 2\n1 29 5\n", {"grade_map": CRANFIELD}, r"cran\.qrels:2: grade 5 is not in the grade map"),
        ("over.qrels", "1 184 1\n", {"grade_map": GradeMap({1: 4})}, r"outside 0\.\.3"),
    ],
)
def test_bad_rows_abort_the_whole_import(tmp_path, store, name, content, kwargs, expected):
    (tmp_path / "good.csv").write_text("query_id,doc_id,relevance\nq0,d0,1\n")
    store.import_file(tmp_path / "good.csv", "ds")
    before = _rows(store.path)
    (tmp_path / name).write_text(content)
    with pytest.raises(InputError, match=expected) as info:
        store.import_file(tmp_path / name, "ds", **kwargs)
    assert "\n" not in str(info.value)
    assert _rows(store.path) == before  # nothing half-imported


def test_grade_map_applies_to_jsonl_and_csv_and_can_drop(tmp_path, store):
    (tmp_path / "c.csv").write_text("query_id,doc_id,relevance\nq1,d1,1\nq1,d2,4\nq1,d3,-1\n")
    store.import_file(tmp_path / "c.csv", "ds", grade_map=GradeMap({1: 3, 4: 1, -1: None}))
    assert store.qrels("ds") == {"q1": {"d1": 3, "d2": 1}}


def test_qrels_for_unknown_dataset_says_how_to_import(store):
    with pytest.raises(LabelError, match=r"no labels for dataset 'nope'.*tuner labels import"):
        store.qrels("nope")


def test_import_cranfield_with_declared_mapping(store, datasets_dir):
    path = datasets_dir / "cranfield" / "cranqrel"
    summary = store.import_file(path, "cranfield", fmt="qrels", grade_map=CRANFIELD)
    # independent count: distinct (qid, doc) pairs of the raw file
    pairs = {tuple(line.split()[:2]) for line in path.read_text().splitlines() if line.strip()}
    assert summary.n_labels == len(pairs)
    assert store.stats("cranfield").n_queries == len({q for q, _ in pairs})


def test_read_judgments_detects_format(tmp_path):
    (tmp_path / "x.ndjson").write_text('{"query_id": "q", "doc_id": "d", "relevance": 2.0}\n')
    assert read_judgments(tmp_path / "x.ndjson") == [Judgment("q", "d", 2, 1)]


def test_unjudged_pairs_dedupe_and_filter():
    hits = [
        {"query_id": "q1", "rank": 3, "doc_id": "a", "title": "A"},
        {"query_id": "q1", "rank": 1, "doc_id": "a", "title": None},
        {"query_id": "q1", "rank": 2, "doc_id": "b"},
        {"query_id": "q2", "rank": 1, "doc_id": "a", "title": "A2"},
    ]
    pairs = unjudged_pairs(hits, {"q1": {"b": 0}}, {"q1": "first", "q2": "second"})
    assert [(p.query_id, p.doc_id, p.best_rank, p.title, p.query) for p in pairs] == [
        ("q1", "a", 1, "A", "first"),
        ("q2", "a", 1, "A2", "second"),
    ]


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_export_unjudged_round_trips_through_import(tmp_path, store, suffix):
    store.import_judgments([Judgment("q1", "known", 2)], "ds", source_file="mem", importer="test")
    hits = [{"query_id": "q1", "rank": r, "doc_id": d, "title": f"T {d}"} for r, d in enumerate(["known", "x", "y", "x"], 1)]
    out = tmp_path / f"todo.{suffix}"
    n = store.export_unjudged("ds", hits, out, queries={"q1": "the query"})
    assert n == 2
    # a grader fills in the relevance values
    if suffix == "csv":
        rows = list(csv.DictReader(out.open()))
        assert [(r["doc_id"], r["title"], r["query"], r["relevance"]) for r in rows] == [
            ("x", "T x", "the query", ""), ("y", "T y", "the query", "")]
        for r in rows:
            r["relevance"] = "3" if r["doc_id"] == "x" else "0"
        with out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(recs) == 1 and [j["relevance"] for j in recs[0]["judgments"]] == [None, None]
        for j in recs[0]["judgments"]:
            j["relevance"] = 3 if j["doc_id"] == "x" else 0
        out.write_text(json.dumps(recs[0]) + "\n")
    store.import_file(out, "ds")
    assert store.qrels("ds") == {"q1": {"known": 2, "x": 3, "y": 0}}


def test_unfilled_export_does_not_import(tmp_path, store):
    out = tmp_path / "todo.csv"
    export_unjudged([{"query_id": "q1", "rank": 1, "doc_id": "x"}], out)
    with pytest.raises(InputError, match=r"todo\.csv:2: empty relevance"):
        store.import_file(out, "ds")
    assert store.datasets() == []
