"""TREC qrels files, with a declared mapping from the file's grades onto 0..3.

A line is ``qid iter docno grade`` (TREC; ``iter`` is ignored) or ``qid docno grade``
(three columns, as in Cranfield's cranqrel). Sources grade on their own scales
(Cranfield: 1 = complete answer .. 4 = minimum interest, -1 = none), so every read
declares a GradeMap; a grade the map does not cover is an error, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import InputError

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class GradeMap:
    """Source grade -> grade on the product scale (Fully=3 .. Irrelevant=0).

    A target of None ("unjudged" in the text form) drops the judgment, so the
    document counts as unjudged: trec_eval's reading of negative grades.
    """

    mapping: Mapping[int, int | None]

    def __post_init__(self) -> None:
        bad = {src: dst for src, dst in self.mapping.items() if dst is not None and dst < 0}
        if bad:
            raise InputError(f"grade map sends {bad} below 0; target grades must be >= 0 (0..3)")

    @classmethod
    def parse(cls, text: str) -> GradeMap:
        """Parse ``"1:3,2:2,3:1,4:1,-1:0"`` (source:target pairs; target ``unjudged`` drops)."""
        mapping: dict[int, int | None] = {}
        for pair in filter(None, (part.strip() for part in text.split(","))):
            match = re.fullmatch(r"(-?\d+)\s*:\s*(-?\d+|unjudged)", pair)
            if match is None:
                raise InputError(
                    f"grade map entry {pair!r} is not 'source:target'; write e.g. '1:3,2:2,-1:0' or '-1:unjudged'"
                )
            source = int(match[1])
            target = None if match[2] == "unjudged" else int(match[2])
            if source in mapping:
                raise InputError(f"grade map lists source grade {source} twice; give each source grade once")
            mapping[source] = target
        if not mapping:
            raise InputError(f"grade map {text!r} is empty; write e.g. '1:3,2:2,3:1,4:1,-1:0'")
        return cls(mapping)

    def describe(self) -> str:
        return ",".join(f"{src}:{'unjudged' if dst is None else dst}" for src, dst in sorted(self.mapping.items()))


#: Grades already on the 0..3 scale.
IDENTITY = GradeMap({0: 0, 1: 1, 2: 2, 3: 3})
#: Cleverdon's codes (1 complete answer, 2 high, 3 useful, 4 minimum interest, -1 none).
CRANFIELD = GradeMap({1: 3, 2: 2, 3: 1, 4: 1, -1: 0})


def read_qrels(path: str | Path, grade_map: GradeMap = IDENTITY) -> Qrels:
    """Read a qrels file into ``{qid: {docno: grade}}`` with grades mapped by grade_map."""
    path = Path(path)
    try:
        # newline=None: universal newlines, so CRLF, LF and a mix of both read the same.
        with path.open(encoding="utf-8", newline=None) as handle:
            return parse_qrels(handle, source=str(path), grade_map=grade_map)
    except OSError as exc:
        raise InputError(f"{path}: cannot read qrels ({exc.strerror}); check the path") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason}); qrels must be plain text") from exc


def parse_qrels(lines: Iterable[str], source: str, grade_map: GradeMap = IDENTITY) -> Qrels:
    """Parse qrels lines; ``source`` names the file in error messages."""
    qrels: Qrels = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"{source}:{number}"
        qid, docno, raw = _fields(fields, where)
        grade = _map_grade(raw, grade_map, where)
        if grade is None:
            continue
        judged = qrels.setdefault(qid, {})
        if judged.get(docno, grade) != grade:
            raise InputError(
                f"{where}: query {qid} doc {docno} judged again with another grade "
                f"({judged[docno]} then {grade}); keep one judgment per pair"
            )
        judged[docno] = grade
    return qrels


def _fields(fields: list[str], where: str) -> tuple[str, str, int]:
    if len(fields) == 4:
        qid, _iteration, docno, grade = fields
    elif len(fields) == 3:
        qid, docno, grade = fields
    else:
        raise InputError(
            f"{where}: expected 'qid iter docno grade' (or 'qid docno grade'), got {len(fields)} fields; "
            "fix or remove the line"
        )
    try:
        return qid, docno, int(grade)
    except ValueError as exc:
        raise InputError(f"{where}: grade {grade!r} is not an integer; fix the line") from exc


def _map_grade(raw: int, grade_map: GradeMap, where: str) -> int | None:
    try:
        return grade_map.mapping[raw]
    except KeyError:
        raise InputError(
            f"{where}: grade {raw} is not in the grade map ({grade_map.describe()}); "
            "declare it, e.g. --grade-map '1:3,2:2,3:1,4:1,-1:0'"
        ) from None
