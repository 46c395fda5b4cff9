from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import InputError
from tuner.runs import parse_jsonl_results, parse_trec_run, read_run


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
    assert run.name == "sys"


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
    ("q1 Q0 a 2 0.1 sys", r"query q1 lists doc a again \(first at line 1\)"),
])
def test_bad_trec_lines_name_file_and_line(line, message):
    with pytest.raises(InputError, match=rf"^r\.run:2: .*{message}"):
        parse_trec_run(["q1 Q0 a 1 0.5 sys", line], "r.run")


def test_jsonl_results_keep_the_given_order_and_empty_answers(tmp_path):
    path = tmp_path / "export.jsonl"
    records = [
        {"query_id": "q1", "results": [{"doc_id": "b", "score": 0.1}, {"doc_id": "a", "score": 0.9}]},
        {"query_id": "q2", "results": []},
        {"query_id": 3, "results": [{"doc_id": "x"}]},
    ]
    path.write_text("\r\n".join(json.dumps(r) for r in records) + "\r\n")
    run = read_run(path)
    assert run.rankings == {"q1": ["b", "a"], "q2": [], "3": ["x"]}
    assert run.scores == {"q1": [0.1, 0.9], "q2": [], "3": [None]}


def test_jsonl_is_detected_by_content(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text('{"query_id": "q", "results": [{"doc_id": "d", "score": 1}]}\n')
    assert read_run(path).rankings == {"q": ["d"]}


@pytest.mark.parametrize("line,message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"results": []}', "'query_id' is missing"),
    ('{"query_id": "q9"}', "'results' must be a list"),
    ('{"query_id": "q9", "results": [{"score": 1}]}', r"'results\[1\].doc_id' is missing"),
    ('{"query_id": "q9", "results": [{"doc_id": "a", "score": "x"}]}', r"results\[1\].score 'x' is not a number"),
    ('{"query_id": "q9", "results": [{"doc_id": "a"}, {"doc_id": "a"}]}', "lists doc a twice"),
    ('{"query_id": "q1", "results": []}', "query q1 appears on two lines"),
])
def test_bad_jsonl_lines_name_file_and_line(line, message):
    first = '{"query_id": "q1", "results": [{"doc_id": "a"}]}'
    with pytest.raises(InputError, match=rf"^out\.jsonl:2: .*{message}"):
        parse_jsonl_results([first, line], "out.jsonl")


def test_missing_run_file_is_an_input_error(tmp_path: Path):
    with pytest.raises(InputError, match="cannot read run file"):
        read_run(tmp_path / "missing.run")
