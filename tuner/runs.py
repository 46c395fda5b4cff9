"""Ranked results read from files: TREC run files and JSONL results exports.

TREC run lines are ``qid Q0 docno rank score tag``. Like trec_eval, the rank column
is ignored and each query's documents are ordered by score descending, ties broken
by docno descending (trec_eval compares docnos with strcmp; Python's str order
is the same for UTF-8 text). JSONL lines are
``{"query_id": ..., "results": [{"doc_id": ..., "score": ...}, ...]}`` and keep the
order given: that is the order the search API returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tuner.errors import InputError


@dataclass(frozen=True)
class Run:
    """Rankings per query in system order, with scores where the file had them."""

    rankings: dict[str, list[str]]
    scores: dict[str, list[float | None]] = field(default_factory=dict)
    name: str | None = None  # the TREC run tag, when there is one


class _Entry(NamedTuple):
    score: float
    docno: str


def read_run(path: str | Path) -> Run:
    """Read a run file: JSONL when it ends in .jsonl / .json or starts with '{', else TREC."""
    path = Path(path)
    lines = _read_lines(path)
    first = next((line for line in lines if line.strip()), "")
    if path.suffix.lower() in (".jsonl", ".json") or first.lstrip().startswith("{"):
        return parse_jsonl_results(lines, source=str(path))
    return parse_trec_run(lines, source=str(path))


def parse_trec_run(lines: Iterable[str], source: str) -> Run:
    """Parse TREC run lines into a Run ordered the way trec_eval orders it."""
    entries: dict[str, list[_Entry]] = {}
    seen: dict[tuple[str, str], int] = {}
    tags: set[str] = set()
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"{source}:{number}"
        if len(fields) != 6:
            raise InputError(
                f"{where}: expected 6 fields 'qid Q0 docno rank score tag', got {len(fields)}; fix the line"
            )
        qid, _q0, docno, _rank, score, tag = fields
        if (qid, docno) in seen:
            raise InputError(
                f"{where}: query {qid} lists doc {docno} again (first at line {seen[qid, docno]}); "
                "remove the repeat"
            )
        seen[qid, docno] = number
        entries.setdefault(qid, []).append(_Entry(_number(score, "score", where), docno))
        tags.add(tag)
    rankings: dict[str, list[str]] = {}
    scores: dict[str, list[float | None]] = {}
    for qid, items in entries.items():
        ordered = sorted(items, reverse=True)  # score desc, then docno desc
        rankings[qid] = [item.docno for item in ordered]
        scores[qid] = [item.score for item in ordered]
    return Run(rankings=rankings, scores=scores, name=",".join(sorted(tags)) or None)


def parse_jsonl_results(lines: Iterable[str], source: str) -> Run:
    """Parse JSONL results (one query per line), keeping the given result order."""
    rankings: dict[str, list[str]] = {}
    scores: dict[str, list[float | None]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        record = _json_object(line, where)
        qid = _text(record.get("query_id"), "query_id", where)
        if qid in rankings:
            raise InputError(f"{where}: query {qid} appears on two lines; give each query one line")
        results = record.get("results")
        if not isinstance(results, list):
            raise InputError(f"{where}: 'results' must be a list of {{doc_id, score}} objects (use [] for none)")
        docs, values = _results(results, qid, where)
        rankings[qid], scores[qid] = docs, values
    return Run(rankings=rankings, scores=scores)


def _results(results: list[Any], qid: str, where: str) -> tuple[list[str], list[float | None]]:
    docs: list[str] = []
    values: list[float | None] = []
    for position, result in enumerate(results, start=1):
        if not isinstance(result, dict):
            raise InputError(f"{where}: query {qid} result {position} is not an object with doc_id")
        doc = _text(result.get("doc_id"), f"results[{position}].doc_id", where)
        score = result.get("score")
        values.append(None if score is None else _number(score, f"results[{position}].score", where))
        docs.append(doc)
    if len(set(docs)) != len(docs):
        repeated = next(doc for i, doc in enumerate(docs) if doc in docs[:i])
        raise InputError(f"{where}: query {qid} lists doc {repeated} twice; remove the repeat")
    return docs, values


def _json_object(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); fix the line") from exc
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with query_id and results")
    return record


def _text(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise InputError(f"{where}: '{key}' is missing or not a non-empty string; add it")
    return str(value)


def _number(value: Any, key: str, where: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not math.isfinite(number):
            raise ValueError
        return number
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {key} {value!r} is not a number; fix it") from exc


def _read_lines(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8", newline=None) as handle:
            return handle.readlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read run file ({exc.strerror}); check the path") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason}); run files must be plain text") from exc
