from __future__ import annotations

from pathlib import Path

import pytest

from tuner.data.qrels import CRANFIELD, IDENTITY, GradeMap, parse_qrels, read_qrels
from tuner.errors import InputError


def write(tmp_path: Path, data: bytes, name: str = "qrels.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_reads_trec_and_three_column_lines_with_mixed_line_endings(tmp_path):
    path = write(tmp_path, b"1 0 d1 3\r\n1 0 d2 0\n2 d9 2\r\n\n2 0 d8 1\n")
    assert read_qrels(path) == {"1": {"d1": 3, "d2": 0}, "2": {"d9": 2, "d8": 1}}


def test_grade_map_translates_source_grades():
    lines = ["1 184 1", "1 29 2", "1 31 3", "1 57 4", "2 12 -1"]
    assert parse_qrels(lines, "cranqrel", CRANFIELD) == {
        "1": {"184": 3, "29": 2, "31": 1, "57": 1},
        "2": {"12": 0},
    }


def test_unjudged_target_drops_the_judgment():
    grade_map = GradeMap.parse("0:0,1:1,-1:unjudged")
    assert parse_qrels(["7 0 a 1", "7 0 b -1"], "q", grade_map) == {"7": {"a": 1}}
    assert grade_map.describe() == "-1:unjudged,0:0,1:1"


def test_grade_outside_the_map_names_file_line_and_fix(tmp_path):
    path = write(tmp_path, b"1 0 d1 3\n1 0 d2 4\n")
    with pytest.raises(InputError, match=rf"{path}:2: grade 4 is not in the grade map \(0:0,1:1,2:2,3:3\).*--grade-map"):
        read_qrels(path, IDENTITY)


@pytest.mark.parametrize("line,message", [
    ("1 0 d1 3 extra", "got 5 fields"),
    ("1 d1", "got 2 fields"),
    ("1 0 d1 high", "grade 'high' is not an integer"),
])
def test_malformed_line_names_file_and_line(line, message):
    with pytest.raises(InputError, match=rf"^run\.qrels:2: .*{message}"):
        parse_qrels(["1 0 ok 1", line], "run.qrels")


def test_conflicting_judgments_are_rejected_but_repeats_are_fine():
    assert parse_qrels(["1 0 d 2", "1 0 d 2"], "q") == {"1": {"d": 2}}
    with pytest.raises(InputError, match=r"q:2: query 1 doc d judged again with another grade \(2 then 3\)"):
        parse_qrels(["1 0 d 2", "1 0 d 3"], "q")


@pytest.mark.parametrize("text,message", [
    ("1:3,2", "not 'source:target'"),
    ("1:3,1:2", "source grade 1 twice"),
    ("", "empty"),
    ("1:-2", "below 0"),
])
def test_bad_grade_map_text(text, message):
    with pytest.raises(InputError, match=message):
        GradeMap.parse(text)


def test_grade_map_parse_round_trip():
    assert GradeMap.parse(" 1:3, 2:2,3:1,4:1,-1:0 ") == CRANFIELD


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read qrels"):
        read_qrels(tmp_path / "nope.txt")


def test_real_cranfield_qrels_with_cleverdon_codes(datasets_dir):
    path = datasets_dir / "cranfield" / "cranqrel"
    qrels = read_qrels(path, CRANFIELD)
    pairs = [line.split() for line in path.read_text().splitlines() if line.strip()]
    assert sum(len(judged) for judged in qrels.values()) == len({(q, d) for q, d, _ in pairs})
    assert len(qrels) == len({q for q, _, _ in pairs})
    assert {g for judged in qrels.values() for g in judged.values()} <= {0, 1, 2, 3}
    assert qrels["1"]["184"] == CRANFIELD.mapping[2]
