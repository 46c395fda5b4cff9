"""The typed answer decoder (tuner.evaluation.answers) is a fast path of
``parse_response(decode_json(...))``: for every mapping and every answer, hostile ones
included, it gives the same ParsedResponse or the same error."""

from __future__ import annotations

import json
import pickle
import random
import struct

import pytest

from tuner.errors import ResponseMappingError
from tuner.evaluation import answers as answers_mod
from tuner.evaluation.answers import AnswerDecoder
from tuner.evaluation.mapping import Hit, decode_json, parse_response
from tuner.evaluation.spec import ResponseMapping

FULL = dict(confidence="confidence", handoff="handoff", fallback_level="fallback_level",
            handoff_reason="handoff_reason")
MAPPINGS = {
    "default": ResponseMapping(),
    "default+signals": ResponseMapping(**FULL),
    "renamed": ResponseMapping(results_path="hits", doc_id="id", score="relevance", title="name", confidence="conf"),
    "no title, no score": ResponseMapping(title=None, score=None),
    "dotted": ResponseMapping(results_path="data.hits", doc_id="meta.id", score="meta.score", title="meta.title",
                              confidence="data.stats.confidence", handoff="flags.handoff",
                              fallback_level="data.fallback"),
    "odd keys": ResponseMapping(results_path="search-results", doc_id="doc id", score="class", title="@title"),
    # Azure AI Search: a key holding a dot, escaped (tuner.evaluation.paths)
    "escaped dot": ResponseMapping(results_path="value", doc_id="id", score=r"@search\.score", title="title"),
    "escaped inside a path": ResponseMapping(results_path=r"odata\.value", doc_id=r"meta.doc\.id",
                                             score=r"meta.@search\.score", title=None),
}
UNTYPED = {
    "list index": ResponseMapping(results_path="data.0.hits"),
    "path inside another": ResponseMapping(results_path="data", confidence="data.confidence"),
    "one field read twice": ResponseMapping(fallback_level="why", handoff_reason="why"),
}


def hit(i: int, **extra: object) -> dict[str, object]:
    return {"doc_id": f"d{i}", "score": 1.0 - i / 100, "title": f"T{i}", "sub_scores": {"bm25": 3.5}, **extra}


def answers() -> list[bytes]:
    """Bodies in the common shape and bodies that break it in every way we know."""
    good = {"results": [hit(i) for i in range(5)], "confidence": 0.4, "handoff": False,
            "fallback_level": "no_filter", "handoff_reason": None, "took_ms": 3}
    bodies: list[object] = [
        good,
        {"results": []},
        {"results": None},
        {},
        {"results": {"d1": 1}},
        [good],
        {"results": [hit(i) for i in range(80)]},  # past top_k
        {"results": [{"doc_id": 7, "score": 1}]},  # an integer id and an integer score
        {"results": [{"doc_id": True, "score": 1.0}]},
        {"results": [{"score": 1.0}]},
        {"results": [{"doc_id": "a", "score": None, "title": None}]},
        {"results": [{"doc_id": "a", "score": "0.5"}]},
        {"results": [{"doc_id": "a", "score": True}]},
        {"results": [{"doc_id": "a", "title": 12}]},
        {"results": ["a", "b"]},
        {"results": [hit(1)], "confidence": True},
        {"results": [hit(1)], "confidence": "0.3"},
        {"results": [hit(1)], "confidence": 3},
        {"results": [hit(1)], "handoff": "true"},
        {"results": [hit(1)], "handoff": 1},
        {"results": [hit(1)], "handoff": 2},
        {"results": [hit(1)], "fallback_level": 3},
        {"results": [{"doc_id": "é✓", "score": -0.0, "title": "naïve \"q\""}]},
        # the renamed and dotted mappings' shapes
        {"hits": [{"id": "x", "relevance": 2.5, "name": "X"}], "conf": 0.9},
        {"hits": [{"id": 4, "relevance": 2.5}]},
        {"data": {"hits": [{"meta": {"id": "m1", "score": 0.5, "title": "M"}}], "stats": {"confidence": 0.7},
                  "fallback": "relaxed"}, "flags": {"handoff": True}},
        {"data": {"hits": [{"meta": {"id": "m1"}}], "stats": None}, "flags": []},
        {"data": {"hits": [{"meta": None}]}},
        {"data": {"hits": None}},
        {"data": None},
        {"data": [{"hits": []}]},
        {"search-results": [{"doc id": "o", "class": 0.25, "@title": "O"}]},
        # the escaped mappings' shapes, and the nested reading the escape must not mean
        {"value": [{"@search.score": 0.03, "id": "a1", "title": "A"}, {"@search.score": 0.02, "id": "a2"}]},
        {"value": [{"@search": {"score": 0.03}, "id": "a1"}]},
        {"value": [{"@search.score": "high", "id": "a1"}]},
        {"odata.value": [{"meta": {"doc.id": "n1", "@search.score": 1.5}}]},
        {"odata": {"value": [{"meta": {"doc": {"id": "n1"}}}]}},
    ]
    raw = [json.dumps(b).encode() for b in bodies]
    raw += [
        b'{"results": [{"doc_id": "a", "score": 1e999}]}',
        b'{"results": [{"doc_id": "a", "score": NaN}]}',
        b'{"results": [{"doc_id": "a", "doc_id": "b", "score": 1}]}',
        b'{"results": [], "confidence": 1e999}',
        b"<html>busy</html>",
        b"",
        b'{"results": [}',
        b'\xef\xbb\xbf{"results": []}',
        '{"results": [{"doc_id": "a"}]}'.encode("utf-16"),
        b'{"results": [{"doc_id": "\xff"}]}',
        b'{"results": [{"doc_id": "a", "score": 100000000000000000000000000}]}',
    ]
    return raw


def general(body: bytes, mapping: ResponseMapping, top_k: int) -> object:
    try:
        return parse_response(decode_json(body, "q1", "application/json"), mapping, "q1", top_k=top_k)
    except (ResponseMappingError, OverflowError) as exc:
        return type(exc), str(exc)


def typed(decoder: AnswerDecoder, body: bytes) -> object:
    try:
        return decoder.parse(body, "q1", "application/json")
    except (ResponseMappingError, OverflowError) as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("name", [*MAPPINGS, *UNTYPED])
@pytest.mark.parametrize("top_k", [3, 50])
def test_every_answer_parses_as_the_general_path_parses_it(name: str, top_k: int) -> None:
    mapping = {**MAPPINGS, **UNTYPED}[name]
    decoder = AnswerDecoder(mapping, top_k)
    assert decoder.typed == (name in MAPPINGS)
    for body in answers():
        assert typed(decoder, body) == general(body, mapping, top_k), body[:80]


@pytest.mark.parametrize("name", list(MAPPINGS))
def test_the_common_shape_takes_the_typed_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer in the shape each mapping names never reaches the general path."""
    mapping = MAPPINGS[name]
    shaped = {
        "default": {"results": [hit(1), hit(2)]},
        "default+signals": {"results": [hit(1)], "confidence": 0.5, "handoff": True, "fallback_level": "x"},
        "renamed": {"hits": [{"id": "x", "relevance": 2.5, "name": "X"}], "conf": 0.9},
        "no title, no score": {"results": [hit(1)]},
        "dotted": {"data": {"hits": [{"meta": {"id": "m1", "score": 0.5}}], "stats": {"confidence": 0.7}}},
        "odd keys": {"search-results": [{"doc id": "o", "class": 0.25}]},
        "escaped dot": {"value": [{"@search.score": 0.03, "id": "a1", "title": "A"}]},
        "escaped inside a path": {"odata.value": [{"meta": {"doc.id": "n1", "@search.score": 1.5}}]},
    }[name]
    body = json.dumps(shaped).encode()
    expected = general(body, mapping, 50)
    assert isinstance(expected, object) and not isinstance(expected, tuple)

    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(answers_mod, "parse_response", refuse)
    parsed = AnswerDecoder(mapping, 50).parse(body, "q1")
    assert parsed == expected
    assert all(type(h) is Hit for h in parsed.hits)


def test_scores_are_the_same_floats_bit_for_bit() -> None:
    """msgspec and orjson read every number to the same double (random bit patterns,
    their shortest repr, 17 digits, and long digit strings that need correct rounding)."""
    rng = random.Random(11)
    texts: list[str] = []
    while len(texts) < 3000:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if value != value or abs(value) == float("inf"):
            continue
        texts += [repr(value), f"{value:.17g}"]
    texts += [f"0.{rng.getrandbits(200)}" for _ in range(500)]
    texts += [f"{rng.getrandbits(80)}.{rng.getrandbits(60)}e-{rng.randint(0, 320)}" for _ in range(500)]
    body = ('{"results": [' + ",".join(f'{{"doc_id": "d{i}", "score": {t}}}' for i, t in enumerate(texts)) + "]}").encode()
    decoder = AnswerDecoder(ResponseMapping(), len(texts))
    fast = [h.score for h in decoder.parse(body, "q1").hits]
    slow = [h.score for h in parse_response(decode_json(body, "q1"), ResponseMapping(), "q1", top_k=len(texts)).hits]
    assert len(fast) == len(texts)
    assert [struct.pack("<d", v) for v in fast] == [struct.pack("<d", v) for v in slow]


def test_hits_pickle_hash_and_compare_as_values() -> None:
    a, b = Hit("d1", 0.5, "T"), Hit("d1", 0.5, "T")
    assert a == b and hash(a) == hash(b) and a != Hit("d1", 0.5)
    assert pickle.loads(pickle.dumps([a, Hit("d2")])) == [a, Hit("d2")]
    with pytest.raises(AttributeError):
        a.score = 1.0  # type: ignore[misc]
