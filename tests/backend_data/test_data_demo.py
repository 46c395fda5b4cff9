"""The demo generator: determinism, the four-tier label rules, completeness of the labels."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fusion_backend.datagen import DEFAULT_SEED, generate_demo, write_demo
from fusion_backend.datagen.catalog import NOW, Product
from fusion_backend.datagen.labels import Intent, grade
from fusion_backend.importers.dataset import render
from fusion_backend.text import analyze


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    write_demo(out)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_same_seed_same_bytes_other_seed_other_data():
    first, again = render(generate_demo(DEFAULT_SEED)), render(generate_demo(DEFAULT_SEED))
    assert first == again
    other = render(generate_demo(DEFAULT_SEED + 1))
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.txt"):
        assert other[name] != first[name]


def test_cli_writes_exactly_the_rendered_bundle(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.datagen", "demo", "--out", str(tmp_path),
                           "--seed", "3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    expected = render(generate_demo(3))
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == expected
    assert proc.stdout.startswith("demo (seed 3): ")


def test_output_is_small_and_counted(bundle: Path):
    manifest = json.loads((bundle / "manifest.json").read_text())
    corpus, queries = _jsonl(bundle / "corpus.jsonl"), _jsonl(bundle / "queries.jsonl")
    qrels = (bundle / "qrels.txt").read_text().splitlines()
    assert 1000 <= len(corpus) <= 3000  # a few thousand listings at most: the service warm-starts fast
    assert manifest["counts"]["documents"] == len(corpus)
    assert manifest["counts"]["queries"] == len(queries)
    assert manifest["counts"]["judgments"] == len(qrels)
    assert manifest["seed"] == DEFAULT_SEED and manifest["now"] == NOW.isoformat()
    assert sum(p.stat().st_size for p in bundle.iterdir()) < 5_000_000


def test_the_tuner_reads_the_query_set_and_labels(bundle: Path):
    from tuner.data.dataset import load_queryset
    from tuner.data.qrels import read_qrels

    queries = load_queryset(bundle / "queries.jsonl")
    assert len(queries.in_scope()) >= 200 and len(queries.oos()) >= 40
    types = {q.query_type for q in queries.in_scope()}
    assert types == {"short", "attribute_heavy", "paraphrase", "long_tail", "exact", "temporal"}
    for q in queries:
        if q.query_type == "temporal":
            assert q.extra == {"date_hint_days": q.extra["date_hint_days"], "now": NOW.isoformat()}
        else:
            assert q.extra == {}
    qrels = read_qrels(bundle / "qrels.txt")
    assert set(qrels) == {q.query_id for q in queries.in_scope()}  # OOS queries have no labels


def _product(**overrides) -> Product:
    base = dict(doc_id="P1", type="sofa", category="living room furniture", colour="deep navy", material="velvet",
                style="classic", brand="Nordvik", model="NO-1234", feature="removable covers", ref="100001",
                date=NOW - dt.timedelta(days=3))
    return Product(**{**base, **overrides})


def test_grade_tiers_by_rule():
    intent = Intent("sofa", colour="deep navy", material="velvet", brand="Nordvik")
    assert grade(intent, _product(), NOW) == 3  # every stated attribute
    assert grade(intent, _product(colour="navy"), NOW) == 2  # one attribute off: strong substitute
    assert grade(intent, _product(colour="navy", brand="Hartwell"), NOW) == 1  # two off: same family only
    assert grade(intent, _product(style="rustic", feature="chaise end"), NOW) == 3  # unstated ones do not count
    assert grade(intent, _product(type="armchair"), NOW) == 1  # another type of the family (seating)
    assert grade(intent, _product(type="mug", category="kitchen"), NOW) == 0


@pytest.mark.parametrize(("age_days", "expected"), [(0, 3), (7, 3), (8, 2), (14, 2), (15, 1), (-1, 1)])
def test_date_tiers_for_a_one_week_hint(age_days, expected):
    intent = Intent("sofa", material="velvet", date_hint_days=7)
    assert grade(intent, _product(date=NOW - dt.timedelta(days=age_days)), NOW) == expected


def _expected_grade(intent: dict, doc: dict, now: dt.date, family: dict[str, str]) -> int:
    """The four-tier rules, written out again independently of fusion_backend.datagen.labels."""
    if doc["product_type"] != intent["type"]:
        return 1 if doc["family"] == family[intent["type"]] else 0
    misses = sum(1 for key in ("colour", "material", "style", "feature", "brand", "model")
                 if key in intent and doc[key] != intent[key])
    if "date_hint_days" in intent:
        age, hint = (now - dt.date.fromisoformat(doc["date"])).days, intent["date_hint_days"]
        misses += 0 if 0 <= age <= hint else 1 if 0 <= age <= 2 * hint else 2
    return 3 if misses == 0 else 2 if misses == 1 else 1


def test_labels_are_complete_and_follow_the_rules(bundle: Path):
    corpus = _jsonl(bundle / "corpus.jsonl")
    manifest = json.loads((bundle / "manifest.json").read_text())
    family = {d["product_type"]: d["family"] for d in corpus}
    now = dt.date.fromisoformat(manifest["now"])
    qrels: dict[str, dict[str, int]] = {}
    for line in (bundle / "qrels.txt").open():
        qid, _, doc_id, g = line.split()
        qrels.setdefault(qid, {})[doc_id] = int(g)
    queries = {q["query_id"]: q for q in _jsonl(bundle / "queries.jsonl")}
    doc_words = {d["doc_id"]: set(analyze(f"{d['title']}\n{d['text']}")) for d in corpus}
    df: dict[str, int] = {}
    for words in doc_words.values():
        for w in words:
            df[w] = df.get(w, 0) + 1
    limit = manifest["distinctive_word_max_df"] * len(corpus)
    assert set(manifest["intents"]) == {q for q, rec in queries.items() if rec["scope"] == "in"}
    for qid, intent in manifest["intents"].items():
        expected = {d["doc_id"]: _expected_grade(intent, d, now, family) for d in corpus}
        relevant = {doc: g for doc, g in expected.items() if g > 0}
        listed = qrels[qid]
        assert {doc: g for doc, g in listed.items() if g > 0} == relevant, qid
        distinctive = {w for w in analyze(queries[qid]["query"]) if df.get(w, 0) <= limit}
        zeros = {doc for doc, g in listed.items() if g == 0}
        assert zeros == {doc for doc, g in expected.items() if g == 0 and doc_words[doc] & distinctive}, qid
        if intent.get("date_hint_days") == 7:
            # Nothing went live this week, so only the latest drop can be Mostly relevant.
            assert 3 not in listed.values() and 2 in listed.values(), qid
        else:
            assert 3 in listed.values(), qid  # every query was written from a real listing


def test_out_of_scope_queries_are_service_requests(bundle: Path):
    oos = [q for q in _jsonl(bundle / "queries.jsonl") if q["scope"] == "oos"]
    assert {q["query_type"] for q in oos} == {"order_tracking", "returns", "refunds", "account", "password",
                                              "shipping"}
    assert len({q["query"] for q in oos}) == len(oos)
