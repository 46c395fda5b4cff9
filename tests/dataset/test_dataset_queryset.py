import hashlib
import json
import pickle

import pytest

from tuner.data.dataset import Query, QuerySet, load_queryset
from tuner.errors import InputError


def _write(tmp_path, lines, name="demo.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _q(qid, text="what is rrf", scope="in", **extra):
    rec = {"query_id": qid, "query": text, "query_type": "short", "source": "faq", "scope": scope}
    rec.update(extra)
    return json.dumps(rec)


def test_loads_fields_extra_and_split(tmp_path):
    path = _write(tmp_path, [
        _q("q1", date_hint_days=30, filters={"lang": "en"}, split="dev"),
        "",
        _q("q2", "buy a car", scope="oos"),
    ])
    qs = load_queryset(path)
    assert qs.dataset_id == "demo"
    assert qs.query_ids == ["q1", "q2"]
    q1 = qs["q1"]
    assert q1 == Query("q1", "what is rrf", "short", "faq", "in", "dev", {"date_hint_days": 30, "filters": {"lang": "en"}})
    assert q1.in_scope and not qs["q2"].in_scope
    assert [q.query_id for q in qs.in_scope()] == ["q1"]
    assert [q.query_id for q in qs.oos()] == ["q2"]
    assert q1.record()["date_hint_days"] == 30 and q1.record()["split"] == "dev"
    assert "q1" in qs and "q9" not in qs and len(qs) == 2


def test_dataset_id_override_and_numeric_ids(tmp_path):
    path = _write(tmp_path, [json.dumps({"query_id": 7, "query": "x", "query_type": "t", "source": "s", "scope": "in"})])
    qs = load_queryset(path, dataset_id="cranfield")
    assert qs.dataset_id == "cranfield" and qs.query_ids == ["7"]


def test_content_hash_is_canonical(tmp_path):
    a = _write(tmp_path, [_q("q1"), _q("q2")], "a.jsonl")
    # same records, other key order / spacing / blank lines
    b = _write(tmp_path, ["", json.dumps(json.loads(_q("q1")), indent=None, separators=(", ", " : "), sort_keys=True),
                          "   ", _q("q2")], "b.jsonl")
    c = _write(tmp_path, [_q("q1"), _q("q2", "another text")], "c.jsonl")
    ha, hb, hc = (load_queryset(p).content_hash for p in (a, b, c))
    canonical = "\n".join(json.dumps(json.loads(_q(q)), sort_keys=True, separators=(",", ":")) for q in ("q1", "q2"))
    assert ha == hb == hashlib.sha256(canonical.encode()).hexdigest()
    assert hc != ha


def test_subset_by_split_and_ids(tmp_path):
    qs = load_queryset(_write(tmp_path, [_q("q1", split="dev"), _q("q2", split="test"), _q("q3", split="dev")]))
    dev = qs.subset(split="dev")
    assert dev.query_ids == ["q1", "q3"] and dev.content_hash == qs.content_hash
    assert qs.subset(query_ids=["q3", "q2"]).query_ids == ["q2", "q3"]
    assert qs.splits() == ["dev", "test"]
    with pytest.raises(KeyError):
        qs.subset(query_ids=["nope"])


def test_queryset_pickles(tmp_path):
    qs = load_queryset(_write(tmp_path, [_q("q1", date_hint_days=3)]))
    again = pickle.loads(pickle.dumps(qs))
    assert again.queries == qs.queries and again["q1"].extra == {"date_hint_days": 3}
    assert hash(qs["q1"]) == hash(again["q1"])


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([_q("q1"), '{"query_id": "q2", "query": '], r"demo\.jsonl:2: malformed JSON"),
        ([_q("q1"), "[1, 2]"], r"demo\.jsonl:2: expected a JSON object"),
        ([json.dumps({"query_id": "q1", "query": "x", "scope": "in", "source": "s"})], r"demo\.jsonl:1: missing field query_type"),
        ([_q("q1"), _q("q2"), _q("q1")], r"demo\.jsonl:3: duplicate query_id 'q1' \(first at line 1\)"),
        ([_q("q1", "   ")], r"demo\.jsonl:1: empty query text for query q1"),
        ([_q("q1", scope="maybe")], r"demo\.jsonl:1: unknown scope 'maybe' for query q1; use 'in' or 'oos'"),
        ([_q("q1", split=3)], r"demo\.jsonl:1: split of query q1 must be a string"),
        ([json.dumps({"query_id": "", "query": "x", "query_type": "t", "source": "s", "scope": "in"})], r"demo\.jsonl:1: query_id must be"),
        (["", "  "], r"demo\.jsonl: query set is empty"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, lines, expected):
    path = _write(tmp_path, lines)
    with pytest.raises(InputError, match=expected) as info:
        load_queryset(path)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_queryset(tmp_path / "nope.jsonl")


def test_queryset_rejects_duplicate_ids_directly():
    q = Query("q1", "x", "t", "s", "in")
    with pytest.raises(InputError, match="not unique"):
        QuerySet("d", "h", (q, q))
