"""BEIR layout: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

* corpus lines ``{"_id", "title", "text", "metadata"?}``; a metadata ``date`` (ISO)
  becomes the document date, the rest of metadata is kept as attributes.
* queries lines ``{"_id", "text", "metadata"?}``; only queries judged in a selected
  split are imported, with ``split`` set from the qrels file name.
* qrels TSV with a header ``query-id corpus-id score``; scores mapped to grades by
  ``--grade-map`` (default auto: the top score -> 3, see grades.auto_grade_map).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .dataset import Dataset, Document, Judgment, Query
from .errors import DataFormatError
from .grades import GradeMap, auto_grade_map
from .querytypes import length_type
from .textfile import is_int, json_object, read_lines, require_file

SHORT_MAX_WORDS = 6
_ISO_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        record = json_object(path, number, line, "write one JSON object per line")
        if "_id" not in record:
            raise DataFormatError.at(path, number, "record has no '_id'", "give every line an '_id' key")
        out.append((number, record))
    return out


def load_corpus(path: Path) -> list[Document]:
    documents = []
    for _, record in _records(path):
        metadata = dict(record.get("metadata") or {})
        raw_date = str(metadata.pop("date", "") or "")
        match = _ISO_DATE.match(raw_date)
        attributes = {"metadata": metadata} if metadata else {}
        documents.append(
            Document(
                str(record["_id"]),
                str(record.get("title") or ""),
                str(record.get("text") or ""),
                match.group(1) if match else None,
                attributes,
            )
        )
    return documents


def load_qrels(qrels_dir: Path, splits: list[str] | None) -> dict[str, list[tuple[str, str, int, int, Path]]]:
    """split -> [(query_id, doc_id, score, line, path)]."""
    available = sorted(p.stem for p in qrels_dir.glob("*.tsv"))
    if not available:
        raise DataFormatError.at(qrels_dir, None, "no qrels/*.tsv files", "point --src at a BEIR dataset directory")
    chosen = splits or available
    missing = [s for s in chosen if s not in available]
    if missing:
        raise DataFormatError.at(
            qrels_dir,
            None,
            f"split(s) {missing} not found (have {available})",
            "pass --splits with existing split names",
        )
    out = {}
    for split in chosen:
        path = qrels_dir / f"{split}.tsv"
        rows = []
        for number, line in enumerate(read_lines(path), start=1):
            parts = line.split("\t")
            if number == 1 and not is_int(parts[-1]):
                continue  # the "query-id corpus-id score" header
            if not line.strip():
                continue
            if len(parts) != 3 or not is_int(parts[2]):
                raise DataFormatError.at(
                    path,
                    number,
                    "expected 'query-id<TAB>corpus-id<TAB>score' with an integer score",
                    "write three tab-separated columns",
                )
            rows.append((parts[0].strip(), parts[1].strip(), int(parts[2]), number, path))
        out[split] = rows
    return out


def import_beir(
    src: Path,
    *,
    splits: list[str] | None = None,
    grade_map: GradeMap | None = None,
    short_max_words: int = SHORT_MAX_WORDS,
) -> Dataset:
    name = src.name or "beir"
    documents = load_corpus(require_file(src, "corpus.jsonl"))
    qrels = load_qrels(src / "qrels", splits)
    grade_map = grade_map or auto_grade_map((row[2] for rows in qrels.values() for row in rows), src / "qrels")
    split_of: dict[str, str] = {}
    judgments: list[Judgment] = []
    seen: dict[tuple[str, str], str] = {}
    for split, rows in qrels.items():
        for query_id, doc_id, score, line, path in rows:
            if split_of.setdefault(query_id, split) != split:
                raise DataFormatError.at(
                    path,
                    line,
                    f"query {query_id} is also in split {split_of[query_id]!r}",
                    "pass --splits to import one of them",
                )
            if (query_id, doc_id) in seen:
                raise DataFormatError.at(
                    path, line, f"pair ({query_id}, {doc_id}) judged twice", "keep one judgment per query and document"
                )
            seen[(query_id, doc_id)] = split
            judgments.append(Judgment(query_id, doc_id, grade_map.grade(score, path, line)))
    queries_path = require_file(src, "queries.jsonl")
    queries = []
    for _, record in _records(queries_path):
        query_id = str(record["_id"])
        if query_id in split_of:
            text = " ".join(str(record.get("text") or "").split())
            queries.append(Query(query_id, text, length_type(text, short_max_words), name, split=split_of[query_id]))
    found = {q.query_id for q in queries}
    absent = sorted(set(split_of) - found)
    if absent:
        raise DataFormatError.at(
            queries_path,
            None,
            f"{len(absent)} judged queries are missing, e.g. {absent[0]!r}",
            "use the queries.jsonl that belongs to these qrels",
        )
    manifest = {
        "source": str(src),
        "splits": list(qrels),
        "grade_mapping": {"name": grade_map.name, "codes": grade_map.describe()},
        "query_type_rule": f"short: <= {short_max_words} words, else long_tail",
    }
    return Dataset(name, documents, queries, judgments, manifest)
