"""Label files: graded judgments read from TREC qrels, JSONL and CSV files.

Grades are 0..3 (Irrelevant, Weakly, Mostly, Fully relevant). The whole file is parsed
and checked before anything uses it, and a bad row is reported as ``file:line``.

Formats: TREC qrels (``qid iter docno label`` with a declared grade mapping, read by
``tuner.data.qrels``), JSONL (``{"query_id": ..., "judgments": [{"doc_id": ..., "relevance": ...}]}``)
and CSV (``query_id,doc_id,relevance`` header; other columns ignored). The label cache
(``tuner.data.labels``) stores what these return.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tuner.data.qrels import IDENTITY, GradeMap, read_qrels
from tuner.errors import InputError

GRADES: tuple[int, ...] = (0, 1, 2, 3)
GRADE_NAMES: dict[int, str] = {0: "Irrelevant", 1: "Weakly", 2: "Mostly", 3: "Fully"}
LabelFormat = Literal["qrels", "jsonl", "csv"]
FORMATS: tuple[str, ...] = ("qrels", "jsonl", "csv")


@dataclass(frozen=True, slots=True)
class Judgment:
    """One graded (query, doc) pair read from a file; ``line`` is 1-based (for errors)."""

    query_id: str
    doc_id: str
    grade: int
    line: int = 0


def map_grade(raw: Any, grade_map: GradeMap, where: str) -> int | None:
    """Map one raw label (an integer, possibly written as text or 2.0) through the grade
    map; None means "unjudged" (the map drops it). InputError naming ``where`` otherwise."""
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        value = int(raw.strip())
    if value is None or value not in grade_map.mapping:
        raise InputError(
            f"{where}: grade {raw!r} is outside the grade mapping ({grade_map.describe()}); "
            "fix the label or declare it with --grade-map SOURCE:GRADE"
        )
    grade = grade_map.mapping[value]
    if grade is not None and grade not in GRADES:
        raise InputError(f"{where}: grade {raw!r} maps to {grade}, outside 0..3; fix --grade-map")
    return grade


def detect_format(path: str | Path) -> LabelFormat:
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    return "qrels"


def read_judgments(
    path: str | Path, fmt: LabelFormat | None = None, grade_map: GradeMap | None = None
) -> list[Judgment]:
    """Parse a label file (format from the extension unless given). Pure apart from reading."""
    p = Path(path)
    fmt = fmt or detect_format(p)
    if fmt not in FORMATS:
        raise InputError(f"{p}: unknown label format {fmt!r}; use one of {', '.join(FORMATS)}")
    gmap = IDENTITY if grade_map is None else grade_map
    if fmt == "qrels":
        return _read_qrels(p, gmap)
    text = _read_text(p)
    reader = _parse_jsonl if fmt == "jsonl" else _parse_csv
    judgments = reader(text, str(p), gmap)
    _check_conflicts(judgments, str(p))
    return judgments


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p}: label file not found; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read label file ({exc}); pass a UTF-8 text file") from exc


def _read_qrels(p: Path, grade_map: GradeMap) -> list[Judgment]:
    # tuner.data.qrels owns the TREC format (3 or 4 columns, CRLF, conflicting duplicates).
    if not p.is_file():
        raise InputError(f"{p}: label file not found; check the path")
    qrels = read_qrels(p, grade_map)
    out = [Judgment(qid, doc, grade) for qid, docs in qrels.items() for doc, grade in docs.items()]
    bad = next((j for j in out if j.grade not in GRADES), None)
    if bad is not None:
        raise InputError(
            f"{p}: grade map sends ({bad.query_id}, {bad.doc_id}) to {bad.grade}, outside 0..3; fix --grade-map"
        )
    return out


def _parse_jsonl(text: str, name: str, grade_map: GradeMap) -> list[Judgment]:
    out: list[Judgment] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where}: malformed JSON ({exc.msg} at column {exc.colno}); write one object per line"
            ) from exc
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object with query_id and judgments")
        qid = _id(rec.get("query_id"), "query_id", where)
        if "judgments" in rec:
            items = rec["judgments"]
            if not isinstance(items, list):
                raise InputError(f"{where}: 'judgments' must be a list of {{doc_id, relevance}} objects")
        elif "doc_id" in rec:  # the flat form: one judgment per line
            items = [rec]
        else:
            raise InputError(
                f'{where}: missing field judgments; write {{"query_id": ..., "judgments": '
                '[{"doc_id": ..., "relevance": ...}]}'
            )
        for i, item in enumerate(items):
            at = f"{where} (judgment {i + 1})" if "judgments" in rec else where
            if not isinstance(item, dict) or "doc_id" not in item or "relevance" not in item:
                raise InputError(f"{at}: each judgment needs doc_id and relevance")
            doc = _id(item["doc_id"], "doc_id", at)
            grade = map_grade(item["relevance"], grade_map, at)
            if grade is not None:
                out.append(Judgment(qid, doc, grade, lineno))
    return out


def _parse_csv(text: str, name: str, grade_map: GradeMap) -> list[Judgment]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(f"{name}: empty CSV; the first line must be the header query_id,doc_id,relevance") from None
    cols = [c.strip() for c in header]
    missing = [c for c in ("query_id", "doc_id", "relevance") if c not in cols]
    if missing:
        raise InputError(
            f"{name}:1: CSV header lacks {', '.join(missing)}; the header must name query_id,doc_id,relevance"
        )
    iq, idoc, irel = cols.index("query_id"), cols.index("doc_id"), cols.index("relevance")
    out: list[Judgment] = []
    try:
        for row in reader:
            where = f"{name}:{reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(cols):
                raise InputError(f"{where}: expected {len(cols)} columns like the header, got {len(row)}")
            rel = row[irel].strip()
            if not rel:
                raise InputError(f"{where}: empty relevance for ({row[iq]}, {row[idoc]}); grade it or delete the row")
            grade = map_grade(rel, grade_map, where)
            if grade is not None:
                out.append(
                    Judgment(_id(row[iq], "query_id", where), _id(row[idoc], "doc_id", where), grade, reader.line_num)
                )
    except csv.Error as exc:
        raise InputError(f"{name}:{reader.line_num}: malformed CSV ({exc})") from exc
    return out


def _id(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InputError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value).strip()


def _check_conflicts(judgments: Sequence[Judgment], name: str) -> None:
    seen: dict[tuple[str, str], Judgment] = {}
    for j in judgments:
        prior = seen.setdefault((j.query_id, j.doc_id), j)
        if prior.grade != j.grade:
            raise InputError(
                f"{name}:{j.line}: ({j.query_id}, {j.doc_id}) graded {j.grade} but {prior.grade} at line "
                f"{prior.line}; keep one grade per pair"
            )
