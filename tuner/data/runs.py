"""Ranked results read from files: TREC runs, JSONL runs and JSON-array runs.

Formats, told apart by content (the first non-blank character), not by file name:

- TREC run lines ``qid Q0 docno rank score tag`` (a file not starting with ``[`` or ``{``);
- JSONL, one query per line: ``{"query_id": "q1", "results": [{"doc_id": "d3", "score": 12.1}, ...]}``;
- JSONL, one hit per line (pyserini): ``{"qid": "q1", "docid": "d3", "rank": 1, "score": 12.1}``;
- a JSON array with one object per query holding its hits (RankGPT / rank_llm):
  ``[{"query": "text", "hits": [{"qid": "q1", "docid": "d3", "rank": 1, "score": 12.1}, ...]}, ...]``,
  or a JSON array of hit objects.

Either spelling works everywhere: ``query_id`` / ``qid``, ``doc_id`` / ``docid``, and a
query's list may be ``results`` or ``hits``. The ``rank`` field, like TREC's rank column,
is ignored. An object with no hits and no query id names no query and is skipped: the
same run written as TREC lines could not list it either.

Order (``order=``):

- ``"trec"`` (default): each query's documents are ranked as trec_eval ranks them, by
  score descending, ties by docno descending (trec_eval compares docnos with strcmp;
  Python's str order is the same for UTF-8 text). So a JSON run scores exactly like
  the same run converted to TREC lines. A query whose results carry no score at all
  keeps the file's order (there is nothing to sort by).
- ``"given"``: the file's order for every query, e.g. captured search-API responses
  scored the way the live scorecard scores them (API order, its own tie order).

Scores are the Python floats parsed from the file's text, never rounded: nearly equal
scores stay distinct (trec_eval 9 compares them as doubles too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tuner.errors import InputError

ORDERS: tuple[str, ...] = ("trec", "given")

_QUERY_KEYS = ("query_id", "qid")
_DOC_KEYS = ("doc_id", "docid")
_LIST_KEYS = ("results", "hits")
_SHAPES = "a query {query_id, results: [...]} or a hit {qid, docid, score}"


@dataclass(frozen=True)
class Run:
    """Rankings per query in ranking order, with scores where the file had them."""

    rankings: dict[str, list[str]]
    scores: dict[str, list[float | None]] = field(default_factory=dict)
    name: str | None = None  # the TREC run tag, when there is one
    format: str | None = None  # "trec", "jsonl" or "json" (a JSON array)


class _Hit(NamedTuple):
    docno: str
    score: float | None
    where: str  # "file:12" or "file: query 3 hit 2", for error messages


class _Queries:
    """Hits grouped by query id in file order, each document at most once per query."""

    def __init__(self) -> None:
        self.hits: dict[str, dict[str, _Hit]] = {}
        self.records: dict[str, str] = {}

    def open(self, qid: str, where: str) -> None:
        """Start a query given as one record (a JSONL line, an array object)."""
        if qid in self.records:
            raise InputError(
                f"{where}: query {qid} appears again (first at {self.records[qid]}); give each query one record"
            )
        self.records[qid] = where
        self.hits.setdefault(qid, {})

    def add(self, qid: str, hit: _Hit) -> None:
        docs = self.hits.setdefault(qid, {})
        first = docs.get(hit.docno)
        if first is not None:
            raise InputError(
                f"{hit.where}: query {qid} lists doc {hit.docno} again (first at {first.where}); remove the repeat"
            )
        docs[hit.docno] = hit

    def run(self, order: str, fmt: str, name: str | None = None) -> Run:
        rankings: dict[str, list[str]] = {}
        scores: dict[str, list[float | None]] = {}
        for qid, docs in self.hits.items():
            ordered = _ordered(qid, list(docs.values()), order)
            rankings[qid] = [hit.docno for hit in ordered]
            scores[qid] = [hit.score for hit in ordered]
        return Run(rankings=rankings, scores=scores, name=name, format=fmt)


def read_run(path: str | Path, order: str = "trec") -> Run:
    """Read a run file in any of the module's formats, detected from its content."""
    path = Path(path)
    check_order(order)
    text = _read_text(path)
    source = str(path)
    first = text.lstrip()[:1]
    if first == "":
        raise InputError(f"{path}: the run file has no results; check the path or re-export the run")
    if first == "[":
        return parse_json_array_run(text, source, order)
    lines = text.split("\n")  # not splitlines(): JSON strings may hold U+2028 and friends
    if first == "{":
        return parse_jsonl_run(lines, source, order)
    return parse_trec_run(lines, source, order)


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise InputError(f"run order {order!r} is not one of: {', '.join(ORDERS)}; use trec (trec_eval's) or given")
    return order


def parse_trec_run(lines: Iterable[str], source: str, order: str = "trec") -> Run:
    """Parse TREC run lines ``qid Q0 docno rank score tag``."""
    queries = _Queries()
    tags: set[str] = set()
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"{source}:{number}"
        if len(fields) != 6:
            raise InputError(
                f"{where}: expected 6 fields 'qid Q0 docno rank score tag', got {len(fields)}; fix the line "
                "(JSON runs start with '[' or '{')"
            )
        qid, _q0, docno, _rank, score, tag = fields
        queries.add(qid, _Hit(docno, _number(score, "score", where), where))
        tags.add(tag)
    return queries.run(order, "trec", name=",".join(sorted(tags)) or None)


def parse_jsonl_run(lines: Iterable[str], source: str, order: str = "trec") -> Run:
    """Parse JSONL: one query record per line, or one hit per line (one form per file)."""
    queries = _Queries()
    form: tuple[str, str] | None = None  # (kind, where it was first seen)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        record = _json_line(line, where)
        kind = _kind(record, where)
        form = _same_form(form, kind, where, "line")
        _add_record(queries, kind, record, where)
    return queries.run(order, "jsonl")


def parse_json_array_run(text: str, source: str, order: str = "trec") -> Run:
    """Parse a JSON array of query objects (each holding ``hits``) or of hit objects."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}); "
            "a run starting with '[' must be one JSON array: fix the file"
        ) from exc
    if not isinstance(items, list):
        raise InputError(f"{source}: expected a JSON array of queries with 'hits'; fix the file")
    queries = _Queries()
    form: tuple[str, str] | None = None
    for number, item in enumerate(items, start=1):
        kind = _kind(item, f"{source}: item {number}")
        where = f"{source}: {kind} {number}"
        form = _same_form(form, kind, where, "object")
        _add_record(queries, kind, item, where)
    return queries.run(order, "json")


def _same_form(form: tuple[str, str] | None, kind: str, where: str, unit: str) -> tuple[str, str]:
    """The file's form (kind, where first seen); one record of the other kind is an error."""
    if form is None:
        return kind, where
    if kind != form[0]:
        raise InputError(
            f"{where}: a {kind} {unit} after {form[0]} {unit}s (first at {form[1]}); use one form per file"
        )
    return form


def _kind(record: Any, where: str) -> str:
    """Tell a query record (holds a results / hits list) from a hit (holds a doc id)."""
    if isinstance(record, dict):
        if any(key in record for key in _LIST_KEYS):
            return "query"
        if any(key in record for key in _DOC_KEYS):
            return "hit"
    raise InputError(f"{where}: expected a JSON object, {_SHAPES}; fix it")


def _add_record(queries: _Queries, kind: str, record: dict[str, Any], where: str) -> None:
    if kind == "hit":
        queries.add(_required(record, _QUERY_KEYS, where), _hit(record, where))
        return
    key = next(key for key in _LIST_KEYS if key in record)
    items = record[key]
    if not isinstance(items, list):
        raise InputError(f"{where}: '{key}' must be a list of {{doc_id, score}} objects (use [] for none)")
    hits = [(item, f"{where} hit {position}") for position, item in enumerate(items, start=1)]
    qid = _query_id(record, hits, where)
    if qid is None:
        return  # no id and no hits: names no query, nothing to rank
    queries.open(qid, where)
    for item, hit_where in hits:
        queries.add(qid, _hit(item, hit_where))


def _query_id(record: dict[str, Any], hits: Sequence[tuple[Any, str]], where: str) -> str | None:
    """The query's id from the record, else from its hits; every hit must agree."""
    qid = _optional(record, _QUERY_KEYS, where)
    for item, hit_where in hits:
        if not isinstance(item, dict):
            _hit(item, hit_where)  # raises the error that names what a hit must be
        own = _optional(item, _QUERY_KEYS, hit_where)
        if qid is None and own is None:
            raise InputError(f"{hit_where}: no query_id (or qid) here or on its query; add one")
        if qid is not None and own is not None and own != qid:
            raise InputError(f"{hit_where}: qid {own} differs from the query's {qid}; give each query its own object")
        qid = qid or own
    return qid


def _hit(item: Any, where: str) -> _Hit:
    if not isinstance(item, dict):
        raise InputError(
            f"{where}: expected an object with doc_id (or docid) and score, got {type(item).__name__}; fix it"
        )
    score = item.get("score")
    return _Hit(_required(item, _DOC_KEYS, where), None if score is None else _number(score, "score", where), where)


def _ordered(qid: str, hits: list[_Hit], order: str) -> list[_Hit]:
    if order == "given":
        return hits
    missing = [hit for hit in hits if hit.score is None]
    if not missing:
        return sorted(hits, key=lambda hit: (hit.score, hit.docno), reverse=True)  # score desc, docno desc
    if len(missing) == len(hits):
        return hits  # no scores at all: the file's order is the only ranking there is
    raise InputError(
        f"{missing[0].where}: query {qid} doc {missing[0].docno} has no score while others do; "
        "give every result a score, or rank by file order with --order given"
    )


def _json_line(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); fix the line (JSONL: one whole object per line)"
        ) from exc


def _optional(record: dict[str, Any], keys: tuple[str, ...], where: str) -> str | None:
    key = next((key for key in keys if key in record), None)
    return None if key is None else _text(record[key], key, where)


def _required(record: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    value = _optional(record, keys, where)
    if value is None:
        raise InputError(f"{where}: no {keys[0]} (or {keys[1]}); add it")
    return value


def _text(value: Any, key: str, where: str) -> str:
    # Numbers are fine as ids (qid 301); floats and bools are not (3.0 != "3").
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise InputError(f"{where}: '{key}' {value!r} is not a non-empty string or integer; fix it")
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


def _read_text(path: Path) -> str:
    try:
        # utf-8-sig drops a byte-order mark; newline=None reads CRLF, LF and mixes alike.
        with path.open(encoding="utf-8-sig", newline=None) as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read run file ({exc.strerror}); check the path") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason}); run files must be plain text") from exc
