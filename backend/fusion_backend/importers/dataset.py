"""The bundle every importer (and the demo generator) produces, and its writer.

A bundle is a directory holding

* ``corpus.jsonl``   the service's corpus: ``{doc_id, title, text, date, ...attributes}``
* ``NAME.queries.jsonl``  the tuner's query set: ``{query_id, query, query_type, source,
  scope, split?, ...extra request fields}``
* ``NAME.qrels.txt``  TREC qrels ``qid 0 docno grade`` with grades 0..3
* ``manifest.json``  counts, the grade mapping and provenance (no timestamps, so a
  bundle built twice from the same input is byte-identical).

The importers name the query set and qrels after the data set (``named=True``) so the
tuner's dataset id is the data set's name, not ``queries``; the demo generator keeps
the plain ``queries.jsonl`` / ``qrels.txt`` that experiments/ point at.

The writer is all-or-nothing: every file is written to a temporary name first and
only renamed into place once all of them were written.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import DataFormatError

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_FILE = "qrels.txt"
MANIFEST_FILE = "manifest.json"

GRADES = (0, 1, 2, 3)
_DOC_KEYS = frozenset({"doc_id", "title", "text", "date"})
_QUERY_KEYS = frozenset({"query_id", "query", "query_type", "source", "scope", "split"})

Scope = Literal["in", "oos"]


@dataclass(frozen=True)
class Document:
    """One corpus record; ``date`` is ``YYYY-MM-DD`` or None."""

    doc_id: str
    title: str
    text: str
    date: str | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        clash = _DOC_KEYS.intersection(self.attributes)
        if clash:
            raise ValueError(f"document {self.doc_id!r}: attribute names {sorted(clash)} are reserved")
        return {"doc_id": self.doc_id, "title": self.title, "text": self.text, "date": self.date, **self.attributes}


@dataclass(frozen=True)
class Query:
    """One query. ``extra`` holds request fields (date hints, ``now``) passed to the service."""

    query_id: str
    query: str
    query_type: str
    source: str
    scope: Scope = "in"
    split: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        clash = _QUERY_KEYS.intersection(self.extra)
        if clash:
            raise ValueError(f"query {self.query_id!r}: extra field names {sorted(clash)} are reserved")
        record: dict[str, Any] = {
            "query_id": self.query_id,
            "query": self.query,
            "query_type": self.query_type,
            "source": self.source,
            "scope": self.scope,
        }
        if self.split is not None:
            record["split"] = self.split
        record.update(self.extra)
        return record


@dataclass(frozen=True)
class Judgment:
    """One graded label, 0 (Irrelevant) .. 3 (Fully relevant)."""

    query_id: str
    doc_id: str
    grade: int


@dataclass
class Dataset:
    """Everything one bundle holds; ``manifest`` carries provenance and mappings."""

    name: str
    documents: list[Document]
    queries: list[Query]
    judgments: list[Judgment]
    manifest: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Reject what would corrupt the bundle: duplicate ids, grades outside 0..3."""
        _unique((d.doc_id for d in self.documents), "doc_id")
        _unique((q.query_id for q in self.queries), "query_id")
        _unique(((j.query_id, j.doc_id) for j in self.judgments), "(query_id, doc_id) judgment")
        for j in self.judgments:
            if j.grade not in GRADES:
                raise ValueError(f"judgment ({j.query_id}, {j.doc_id}): grade {j.grade} is outside 0..3")
        for q in self.queries:
            if q.scope not in ("in", "oos"):
                raise ValueError(f"query {q.query_id!r}: scope {q.scope!r} is not 'in' or 'oos'")

    def counts(self) -> dict[str, Any]:
        doc_ids = {d.doc_id for d in self.documents}
        query_ids = {q.query_id for q in self.queries}
        judged_queries = {j.query_id for j in self.judgments if j.grade > 0}
        by_grade = {str(g): sum(1 for j in self.judgments if j.grade == g) for g in GRADES}
        by_type: dict[str, int] = {}
        for q in self.queries:
            by_type[q.query_type] = by_type.get(q.query_type, 0) + 1
        return {
            "documents": len(self.documents),
            "documents_with_date": sum(1 for d in self.documents if d.date is not None),
            "queries": len(self.queries),
            "queries_in_scope": sum(1 for q in self.queries if q.scope == "in"),
            "queries_oos": sum(1 for q in self.queries if q.scope == "oos"),
            "queries_by_type": dict(sorted(by_type.items())),
            "queries_in_scope_without_relevant": sum(
                1 for q in self.queries if q.scope == "in" and q.query_id not in judged_queries
            ),
            "judgments": len(self.judgments),
            "judgments_by_grade": by_grade,
            "judgments_unknown_doc": sum(1 for j in self.judgments if j.doc_id not in doc_ids),
            "judgments_unknown_query": sum(1 for j in self.judgments if j.query_id not in query_ids),
        }


def _unique(keys: Iterable[Any], what: str) -> None:
    seen: set[Any] = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"duplicate {what} {key!r}")
        seen.add(key)


def _jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def file_names(name: str, named: bool) -> tuple[str, str]:
    """(query set, qrels) file names: ``NAME.queries.jsonl`` / ``NAME.qrels.txt`` when ``named``."""
    return (f"{name}.{QUERIES_FILE}", f"{name}.{QRELS_FILE}") if named else (QUERIES_FILE, QRELS_FILE)


def render(dataset: Dataset, *, named: bool = False) -> dict[str, str]:
    """The bundle's files as text, keyed by file name (pure: no I/O)."""
    dataset.validate()
    queries_file, qrels_file = file_names(dataset.name, named)
    manifest = {"name": dataset.name, "counts": dataset.counts(), **dataset.manifest}
    return {
        CORPUS_FILE: _jsonl(d.to_record() for d in dataset.documents),
        queries_file: _jsonl(q.to_record() for q in dataset.queries),
        qrels_file: "".join(f"{j.query_id} 0 {j.doc_id} {j.grade}\n" for j in dataset.judgments),
        MANIFEST_FILE: json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
    }


def write_dataset(
    dataset: Dataset, out_dir: Path, extra_files: Mapping[str, str] | None = None, *, named: bool = False
) -> list[Path]:
    """Write the bundle (plus ``extra_files``: relative name -> text) atomically into ``out_dir``."""
    try:
        files = {**render(dataset, named=named), **(extra_files or {})}
    except ValueError as exc:
        raise DataFormatError.at(
            out_dir, None, f"refusing to write an invalid bundle: {exc}", "fix the input data named above"
        ) from exc
    return write_files_atomically(out_dir, files)


def write_files_atomically(out_dir: Path, files: Mapping[str, str]) -> list[Path]:
    """Write every file under a temporary name, then rename them all into place."""
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in files.items():
            target = out_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            # open(..., "x") rather than mkstemp: the file gets the umask's usual mode, not 0600.
            tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
                staged.append((tmp, target))
                fh.write(text)
        for tmp, target in staged:
            os.replace(tmp, target)
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise DataFormatError.at(
            out_dir, None, f"cannot write the bundle ({exc.strerror})", "choose a writable --out directory"
        ) from exc
    return [target for _, target in staged]
