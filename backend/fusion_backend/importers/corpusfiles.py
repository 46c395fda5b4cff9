"""A corpus given as one file: JSONL or TSV (``files --corpus``).

* JSONL, one document per line: the id from ``doc_id``, ``_id`` or ``id`` (BEIR, MS
  MARCO-style and pyserini JSONL), the text from ``text`` or ``contents``, ``title``
  optional, ``date`` (or a BEIR ``metadata.date``) kept when it parses as a date. Other
  keys are kept as document attributes; the service ignores them.
* TSV: ``doc_id<TAB>text`` or ``doc_id<TAB>title<TAB>text``; a first line naming its
  columns (``id``/``doc_id``/``docid``/``_id``/``pid`` first, e.g. ``id text title``)
  is a header and maps the columns by name.

The format is told by the extension (``.jsonl``/``.json``, ``.tsv``; ``.gz`` allowed) or
else by the first character (``{`` JSONL, else TSV). Duplicate ids stop the import
with both line numbers.
"""

from __future__ import annotations

from pathlib import Path

from .dataset import Document
from .errors import DataFormatError
from .textfile import first_char, first_value, json_object, read_lines
from .trec import parse_date

_ID_KEYS = ("doc_id", "_id", "id")
_TEXT_KEYS = ("text", "contents")
_RESERVED = frozenset({*_ID_KEYS, *_TEXT_KEYS, "title", "date"})
_HEADER_IDS = frozenset({"id", "doc_id", "docid", "_id", "pid"})


def read_corpus_file(path: Path) -> list[Document]:
    lines = read_lines(path)
    if _is_jsonl(path, lines):
        numbered = [(n, _json_document(path, n, line)) for n, line in enumerate(lines, 1) if line.strip()]
    else:
        numbered = _tsv_documents(path, lines)
    if not numbered:
        raise DataFormatError.at(path, None, "the corpus holds no documents", "pass the corpus file to --corpus")
    seen: dict[str, int] = {}
    for number, doc in numbered:
        if doc.doc_id in seen:
            raise DataFormatError.at(
                path,
                number,
                f"doc_id {doc.doc_id!r} already used on line {seen[doc.doc_id]}",
                "give every document its own id",
            )
        seen[doc.doc_id] = number
    return [doc for _, doc in numbered]


def _is_jsonl(path: Path, lines: list[str]) -> bool:
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    if suffix in (".jsonl", ".json", ".tsv"):
        return suffix != ".tsv"
    return first_char(lines) == "{"


def _json_document(path: Path, number: int, line: str) -> Document:
    fix = 'write one {"doc_id": ..., "title": ..., "text": ...} object per line'
    record = json_object(path, number, line, fix)
    doc_id = first_value(record, _ID_KEYS)
    if doc_id is None:
        raise DataFormatError.at(path, number, "record has no 'doc_id' (or '_id' / 'id')", fix)
    metadata = dict(record["metadata"]) if isinstance(record.get("metadata"), dict) else None
    raw_date = record.get("date") or (metadata.pop("date", None) if metadata is not None else None)
    attributes = {k: v for k, v in record.items() if k not in _RESERVED and k != "metadata"}
    if metadata:
        attributes["metadata"] = metadata
    return Document(
        str(doc_id),
        str(record.get("title") or ""),
        str(first_value(record, _TEXT_KEYS) or ""),
        parse_date(str(raw_date)) if raw_date else None,
        attributes,
    )


def _tsv_documents(path: Path, lines: list[str]) -> list[tuple[int, Document]]:
    columns: list[str] | None = None
    documents = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if number == 1 and parts[0].strip().lower() in _HEADER_IDS:
            columns = [p.strip().lower() for p in parts]
            continue
        documents.append((number, _tsv_document(path, number, parts, columns)))
    return documents


def _tsv_document(path: Path, number: int, parts: list[str], columns: list[str] | None) -> Document:
    if columns is None and len(parts) not in (2, 3):
        raise DataFormatError.at(
            path,
            number,
            f"expected 'doc_id<TAB>text' or 'doc_id<TAB>title<TAB>text', got {len(parts)} tab-separated columns",
            "separate the columns with single tabs",
        )
    if columns is not None and len(parts) != len(columns):
        raise DataFormatError.at(
            path,
            number,
            f"expected {len(columns)} columns as the header names, got {len(parts)}",
            "give every line one value per header column",
        )
    if columns is None:
        columns = ["id", "text"] if len(parts) == 2 else ["id", "title", "text"]
    row = dict(zip(columns, (" ".join(p.split()) for p in parts), strict=True))
    if not parts[0].strip():
        raise DataFormatError.at(path, number, "empty doc_id", "start every line with the document id")
    return Document(parts[0].strip(), row.get("title", ""), row.get("text", row.get("contents", "")))
