"""Queries given as one file (``files --queries`` and ``--oos``): JSONL, TSV or TREC topics.

* JSONL: the id from ``query_id``, ``_id`` or ``qid``, the text from ``query`` or ``text``.
  A record that already carries the tuner's ``query_type`` / ``source`` / ``scope`` /
  ``split`` keeps them; other scalar keys (``date_hint_days``, ``now``, ...) stay as
  extra request fields; ``metadata`` (BEIR) and nested values are left out, because
  the evaluation would send them with every request.
* SMART records (CACM's ``query.text``, Cranfield's ``cran.qry``): ``.I id`` then
  field lines ``.W`` (the text; ``.T`` when there is no ``.W``), ``.A``, ``.N``, ...;
  the id is the ``.I`` id as written.
* Anything else goes to the TREC topic parser: ``<top>`` SGML topics or ``qid<TAB>text``.

Told apart by the extension (``.jsonl``/``.json``) or the first line (``{``, ``.I``).
``--queries`` and ``--oos`` read the same formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .dataset import Query, Scope
from .errors import DataFormatError
from .querytypes import length_type
from .smart import parse_smart
from .textfile import first_char, first_value, json_object, read_lines
from .trec import QueryField, topic_queries

_ID_KEYS = ("query_id", "_id", "qid")
_TEXT_KEYS = ("query", "text")
_SKIPPED = frozenset({*_ID_KEYS, *_TEXT_KEYS, "id", "metadata", "query_type", "source", "scope", "split"})
OOS_TYPE = "off_topic"
_SMART_MARKERS = "ABCDEFGHJKLMNOPQRSTUVWXYZ"  # every field letter but .I (the record id)


def read_query_file(
    path: Path, *, source: str, scope: Scope, short_max_words: int, query_field: QueryField = "title"
) -> list[Query]:
    lines = read_lines(path)
    if path.suffix not in (".jsonl", ".json") and first_char(lines) != "{":
        if next((line for line in lines if line.strip()), "").startswith(".I"):
            return _smart_queries(path, source, scope, short_max_words)
        return topic_queries(path, query_field, short_max_words, source, scope)
    queries: list[Query] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        query = _json_query(path, number, line, source, scope, short_max_words)
        if query.query_id in seen:
            raise DataFormatError.at(
                path,
                number,
                f"query_id {query.query_id!r} already used on line {seen[query.query_id]}",
                "give every query its own id",
            )
        seen[query.query_id] = number
        queries.append(query)
    return queries


def _json_query(path: Path, number: int, line: str, source: str, scope: Scope, short_max_words: int) -> Query:
    fix = 'write one {"query_id": ..., "query": ...} object per line'
    record = json_object(path, number, line, fix)
    query_id, text = first_value(record, _ID_KEYS), first_value(record, _TEXT_KEYS)
    if query_id is None or text is None:
        raise DataFormatError.at(
            path, number, "record needs a 'query_id' (or '_id' / 'qid') and a 'query' (or 'text')", fix
        )
    text = " ".join(str(text).split())
    own_scope = scope if scope == "oos" else record.get("scope", "in")  # --oos wins over the record
    if own_scope not in ("in", "oos"):
        raise DataFormatError.at(path, number, f"scope {own_scope!r} is not 'in' or 'oos'", "use scope in or oos")
    default_type = length_type(text, short_max_words) if own_scope == "in" else OOS_TYPE
    extra = {k: v for k, v in record.items() if k not in _SKIPPED and not isinstance(v, (dict, list))}
    return Query(
        str(query_id),
        text,
        str(record.get("query_type") or default_type),
        str(record.get("source") or source),
        own_scope,
        _split(record),
        extra,
    )


def _split(record: dict[str, Any]) -> str | None:
    return None if record.get("split") is None else str(record["split"])


def _smart_queries(path: Path, source: str, scope: Scope, short_max_words: int) -> list[Query]:
    queries = []
    for record in parse_smart(path, _SMART_MARKERS):
        text = record.text("W") or record.text("T")
        if not text:
            raise DataFormatError.at(
                path,
                record.line,
                f"query .I {record.record_id} has no '.W' text",
                "add the query text under a '.W' line",
            )
        query_type = length_type(text, short_max_words) if scope == "in" else OOS_TYPE
        queries.append(Query(record.record_id, text, query_type, source, scope))
    return queries
