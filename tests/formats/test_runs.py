from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.data.runs import parse_json_array_run, parse_jsonl_run, parse_trec_run, read_run
from tuner.errors import InputError


def test_trec_run_is_ordered_by_score_then_docno_descending_ignoring_rank():
    lines = [
        "q1 Q0 b 1 0.5 sys",
        "q1 Q0 a 2 0.9 sys",
        "q1 Q0 c 3 0.5 sys",  # ties with b: docno descending puts c first
        "q1 Q0 aa 4 0.5 sys",
        "q2 Q0 z 1 -1e-3 sys",
    ]
    run = parse_trec_run(lines, "run")
    assert run.rankings == {"q1": ["a", "c", "b", "aa"], "q2": ["z"]}
    assert run.scores["q1"] == [0.9, 0.5, 0.5, 0.5]
    assert run.name == "sys" and run.format == "trec"


def test_trec_run_matches_trec_eval_reference_file(datasets_dir):
    path = datasets_dir / "trec_eval_reference" / "results.test"
    run = read_run(path)
    assert sorted(run.rankings) == ["301", "302", "303"]
    rows = [line.split() for line in path.read_text().splitlines()]
    for qid, ranking in run.rankings.items():
        mine = [(float(s), d) for q, _, d, _, s, _ in rows if q == qid]
        assert ranking == [d for _, d in sorted(mine, reverse=True)]
        assert len(ranking) == 500


@pytest.mark.parametrize("line,message", [
    ("q1 Q0 d 1 0.5", "expected 6 fields"),
    ("q1 Q0 d 1 high sys", "score 'high' is not a number"),
    ("q1 Q0 d 1 nan sys", "score 'nan' is not a number"),
    ("q1 Q0 a 2 0.1 sys", r"query q1 lists doc a again \(first at r\.run:1\)"),
])
def test_bad_trec_lines_name_file_and_line(line, message):
    with pytest.raises(InputError, match=rf"^r\.run:2: .*{message}"):
        parse_trec_run(["q1 Q0 a 1 0.5 sys", line], "r.run")


# One run in every format. Ties (d2/d9/d10 at 0.5) and a score that differs from its
# neighbour only in the last bit (1.0000000000000002 vs 1.0) test order and precision.
HITS = {
    "q1": [("d2", 0.5), ("d1", 1.0), ("d9", 0.5), ("d3", 1.0000000000000002), ("d10", 0.5)],
    "q2": [("x", -3.25), ("y", 0.1 + 0.2)],
}
EXPECTED = {q: sorted(hits, key=lambda h: (h[1], h[0]), reverse=True) for q, hits in HITS.items()}


def as_trec(path: Path) -> None:
    path.write_text("".join(f"{q} Q0 {d} {r} {s!r} t\n" for q, hits in HITS.items()
                            for r, (d, s) in enumerate(hits, 1)))


def as_jsonl_queries(path: Path) -> None:
    path.write_text("".join(json.dumps({"query_id": q, "results": [{"doc_id": d, "score": s} for d, s in hits]}) + "\n"
                            for q, hits in HITS.items()))


def as_jsonl_hits(path: Path) -> None:  # pyserini: one {qid, docid, rank, score} per line
    path.write_text("".join(json.dumps({"qid": q, "docid": d, "rank": r, "score": s}) + "\n"
                            for q, hits in HITS.items() for r, (d, s) in enumerate(hits, 1)))


def as_json_array(path: Path) -> None:  # RankGPT / rank_llm: query text + hits carrying the qid
    path.write_text(json.dumps([{"query": f"text of {q}", "hits": [
        {"content": "...", "qid": q, "docid": d, "rank": r, "score": s} for r, (d, s) in enumerate(hits, 1)]}
        for q, hits in HITS.items()], indent=2))


def as_json_array_other_spelling(path: Path) -> None:
    path.write_text(json.dumps([{"query_id": q, "hits": [{"doc_id": d, "score": s} for d, s in hits]}
                                for q, hits in HITS.items()]))


def as_json_array_of_hits(path: Path) -> None:
    path.write_text(json.dumps([{"qid": q, "docid": d, "score": s} for q, hits in HITS.items() for d, s in hits]))


WRITERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "trec": (as_trec, "trec"),
    "jsonl queries": (as_jsonl_queries, "jsonl"),
    "jsonl hits": (as_jsonl_hits, "jsonl"),
    "json array": (as_json_array, "json"),
    "json array, query_id/doc_id": (as_json_array_other_spelling, "json"),
    "json array of hits": (as_json_array_of_hits, "json"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_format_parses_to_the_same_trec_eval_ordered_run(tmp_path, writer):
    write, fmt = WRITERS[writer]
    path = tmp_path / "run.data"  # no telling suffix: the content decides
    write(path)
    run = read_run(path)
    assert run.format == fmt
    assert run.rankings == {q: [d for d, _ in hits] for q, hits in EXPECTED.items()}
    assert run.scores == {q: [s for _, s in hits] for q, hits in EXPECTED.items()}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_given_order_keeps_the_file_order(tmp_path, writer):
    write, _ = WRITERS[writer]
    path = tmp_path / "run.data"
    write(path)
    run = read_run(path, order="given")
    assert run.rankings == {q: [d for d, _ in hits] for q, hits in HITS.items()}


def test_scores_round_trip_at_full_precision(tmp_path):
    scores = [1 / 3, 0.1 + 0.2, 1e-300, 12345678.123456789, 2.0**-1074, 7e22, 1.0000000000000002, 1.0]
    docs = [f"d{i}" for i in range(len(scores))]
    trec, array = tmp_path / "run.trec", tmp_path / "run.json"
    trec.write_text("".join(f"q Q0 {d} 0 {s!r} t\n" for d, s in zip(docs, scores)))
    array.write_text(json.dumps([{"qid": "q", "hits": [{"docid": d, "score": s} for d, s in zip(docs, scores)]}]))
    for path in (trec, array):
        run = read_run(path)
        assert sorted(run.scores["q"], reverse=True) == run.scores["q"]
        assert dict(zip(run.rankings["q"], run.scores["q"])) == dict(zip(docs, scores))  # exact, not approx
        # Rounded to 6 significant digits these two would tie and d7 (docno desc) would win.
        assert run.rankings["q"].index("d6") < run.rankings["q"].index("d7")


def test_jsonl_results_keep_empty_answers_and_unscored_order(tmp_path):
    path = tmp_path / "export.jsonl"
    records = [
        {"query_id": "q1", "results": [{"doc_id": "b", "score": 0.1}, {"doc_id": "a", "score": 0.9}]},
        {"query_id": "q2", "results": []},
        {"query_id": 3, "results": [{"doc_id": "y"}, {"doc_id": "x"}]},  # no scores: file order
    ]
    path.write_text("\r\n".join(json.dumps(r) for r in records) + "\r\n")
    run = read_run(path)
    assert run.rankings == {"q1": ["a", "b"], "q2": [], "3": ["y", "x"]}
    assert run.scores == {"q1": [0.9, 0.1], "q2": [], "3": [None, None]}


def test_detection_is_by_content_not_suffix(tmp_path):
    trec_named_json = tmp_path / "run.json"
    trec_named_json.write_text("q Q0 d 1 1.5 t\n")
    array_named_txt = tmp_path / "run.txt"
    array_named_txt.write_text('\ufeff\n  [{"qid": "q", "hits": [{"docid": "d", "score": 1.5}]}]')
    jsonl_named_run = tmp_path / "results.run"
    jsonl_named_run.write_text('{"query_id": "q", "results": [{"doc_id": "d", "score": 1.5}]}\n')
    for path in (trec_named_json, array_named_txt, jsonl_named_run):
        assert read_run(path).rankings == {"q": ["d"]}


def test_array_object_without_id_or_hits_names_no_query_and_is_skipped():
    text = json.dumps([{"query": "nothing found", "hits": []}, {"query_id": "q2", "hits": []},
                       {"hits": [{"qid": "q3", "docid": "d", "score": 1}]}])
    assert parse_json_array_run(text, "r.json").rankings == {"q2": [], "q3": ["d"]}


@pytest.mark.parametrize("line,message", [
    ("{not json", r"^out\.jsonl:2: not valid JSON"),
    ("[1, 2]", r"^out\.jsonl:2: expected a JSON object"),
    ('{"query_id": "q9"}', r"^out\.jsonl:2: expected a JSON object, a query"),
    ('{"results": [{"doc_id": "a"}]}', r"^out\.jsonl:2 hit 1: no query_id \(or qid\)"),
    ('{"query_id": "q9", "results": {"doc_id": "a"}}', r"^out\.jsonl:2: 'results' must be a list"),
    ('{"query_id": "q9", "results": [{"score": 1}]}', r"^out\.jsonl:2 hit 1: no doc_id \(or docid\); add it"),
    ('{"query_id": "q9", "results": ["a"]}', r"^out\.jsonl:2 hit 1: expected an object with doc_id"),
    ('{"query_id": "q9", "results": [{"doc_id": "a", "score": "x"}]}', r"^out\.jsonl:2 hit 1: score 'x' is not"),
    ('{"query_id": 1.5, "results": []}', r"^out\.jsonl:2: 'query_id' 1\.5 is not a non-empty string"),
    ('{"query_id": "q9", "results": [{"doc_id": "a"}, {"doc_id": "a"}]}',
     r"^out\.jsonl:2 hit 2: query q9 lists doc a again \(first at out\.jsonl:2 hit 1\)"),
    ('{"query_id": "q1", "results": []}', r"^out\.jsonl:2: query q1 appears again \(first at out\.jsonl:1\)"),
    ('{"qid": "q9", "docid": "a", "score": 1}', r"^out\.jsonl:2: a hit line after query lines"),
    ('{"query_id": "q9", "results": [{"doc_id": "a", "score": 1}, {"doc_id": "b"}]}',
     r"^out\.jsonl:2 hit 2: query q9 doc b has no score while others do; .*--order given"),
])
def test_bad_jsonl_lines_are_one_line_errors_naming_file_and_line(line, message):
    first = '{"query_id": "q1", "results": [{"doc_id": "a"}]}'
    with pytest.raises(InputError, match=message) as caught:
        parse_jsonl_run([first, line], "out.jsonl")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("items,message", [
    ([{"qid": "q", "hits": []}, "oops"], r"^r\.json: item 2: expected a JSON object"),
    ([{"qid": "q", "hits": [{"docid": "a", "qid": "other"}]}], r"^r\.json: query 1 hit 1: qid other differs from"),
    ([{"query": "t", "hits": [{"docid": "a"}]}], r"^r\.json: query 1 hit 1: no query_id \(or qid\)"),
    ([{"query": "t", "hits": [{"qid": "q", "docid": "a"}, {"qid": "p", "docid": "b"}]}],
     r"^r\.json: query 1 hit 2: qid p differs from the query's q"),
    ([{"qid": "q", "hits": []}, {"qid": "q", "hits": []}],
     r"^r\.json: query 2: query q appears again \(first at r\.json: query 1\)"),
    ([{"qid": "q", "hits": [{"docid": "a"}, {"docid": "a"}]}], r"^r\.json: query 1 hit 2: query q lists doc a again"),
    ([{"qid": "q", "hits": [{"docid": "a", "score": None}, {"docid": "b", "score": 2}]}],
     r"^r\.json: query 1 hit 1: query q doc a has no score while others do"),
    ([{"qid": "q", "hits": []}, {"qid": "p", "docid": "a"}], r"^r\.json: hit 2: a hit object after query objects"),
    ([{"qid": "q", "docid": "a", "score": True}], r"^r\.json: hit 1: score True is not a number"),
])
def test_bad_json_array_runs_name_file_query_and_hit(items, message):
    with pytest.raises(InputError, match=message) as caught:
        parse_json_array_run(json.dumps(items), "r.json")
    assert "\n" not in str(caught.value)


def test_invalid_json_array_names_the_line_and_column(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('[\n  {"qid": "q", "hits": [\n    {"docid": "a", "score": 1.5,}\n  ]}\n]\n')
    with pytest.raises(InputError, match=rf"^{path}:3: not valid JSON \(.*column \d+\); .*one JSON array"):
        read_run(path)


def test_empty_missing_and_unknown_order_are_input_errors(tmp_path: Path):
    empty = tmp_path / "empty.run"
    empty.write_text("\n  \n")
    with pytest.raises(InputError, match="has no results"):
        read_run(empty)
    with pytest.raises(InputError, match="cannot read run file"):
        read_run(tmp_path / "missing.run")
    with pytest.raises(InputError, match="run order 'score' is not one of: trec, given"):
        read_run(empty, order="score")
