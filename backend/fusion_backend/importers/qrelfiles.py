"""Relevance judgments in the forms collections ship them, as raw integer codes.

* TREC: ``qid iter docno rel`` (4 columns) or ``qid docno rel`` (3 columns), any
  whitespace; every line of a file must have the same number of columns.
* BEIR TSV: the same 3 columns after a header line ``query-id corpus-id score`` (a
  first line whose last column is named score, relevance, grade, rel or label).
* JSONL: ``{"query_id", "doc_id", "relevance"}`` per line (also ``qid`` / ``docid`` /
  ``corpus_id`` and ``score`` / ``grade``).

Codes are mapped to grades 0..3 by grades.GradeMap afterwards; a pair judged twice is an
error naming both lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DataFormatError
from .textfile import first_char, is_int, json_object, read_lines, split_rows

_QUERY_KEYS = ("query_id", "qid")
_DOC_KEYS = ("doc_id", "docid", "corpus_id")
_CODE_KEYS = ("relevance", "score", "grade")
_HEADER_LAST = frozenset({*_CODE_KEYS, "rel", "label"})


@dataclass(frozen=True)
class RawQrel:
    query_id: str
    doc_id: str
    code: int
    line: int


def parse_qrels(path: Path) -> list[RawQrel]:
    lines = read_lines(path)
    rows = _jsonl_rows(path, lines) if first_char(lines) == "{" else _column_rows(path, lines)
    seen: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row.query_id, row.doc_id)
        if key in seen:
            raise DataFormatError.at(
                path,
                row.line,
                f"pair ({row.query_id}, {row.doc_id}) already judged on line {seen[key]}",
                "keep one judgment per query and document",
            )
        seen[key] = row.line
    return rows


def _column_rows(path: Path, lines: list[str]) -> list[RawQrel]:
    rows: list[RawQrel] = []
    width = 0
    for number, parts in split_rows(lines):
        if number == 1 and parts[-1].lower() in _HEADER_LAST:
            continue  # a BEIR-style header "query-id corpus-id score"
        width = width or len(parts)
        if len(parts) not in (3, 4) or len(parts) != width:
            raise DataFormatError.at(
                path,
                number,
                f"expected {width if width in (3, 4) else '3 or 4'} columns "
                f"('qid iter docno rel' or 'qid docno rel'), got {len(parts)}",
                "write each judgment as 'qid 0 docno rel' on its own line",
            )
        if not is_int(parts[-1]):
            raise DataFormatError.at(
                path, number, f"relevance {parts[-1]!r} is not an integer", "use integer relevance codes"
            )
        rows.append(RawQrel(parts[0], parts[-2], int(parts[-1]), number))
    return rows


def _jsonl_rows(path: Path, lines: list[str]) -> list[RawQrel]:
    rows = []
    fix = 'write {"query_id": ..., "doc_id": ..., "relevance": <int>} per line'
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = json_object(path, number, line, fix)
        query_id, doc_id, code = (_value(record, keys) for keys in (_QUERY_KEYS, _DOC_KEYS, _CODE_KEYS))
        if query_id is None or doc_id is None or not is_int(str(code)) or isinstance(code, (bool, float)):
            raise DataFormatError.at(path, number, "record needs a query_id, a doc_id and an integer relevance", fix)
        rows.append(RawQrel(str(query_id), str(doc_id), int(str(code)), number))
    return rows


def _value(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((record[k] for k in keys if record.get(k) is not None), None)
