"""CACM: 3,204 Communications of the ACM abstracts (1958-1979), 64 queries, binary qrels.

* Dates: the ``.B`` field names the issue ("CACM December, 1958", also "CACM
  November,1960", "June, 1969", "CACM JUly 1973"): the date is the first of that month.
* Only about half the records have an abstract (``.W``); the text is then empty and
  the title carries the record. Keywords (``.K``) and authors (``.A``) are attributes.
* ``qrels.text`` lines are ``qid docid 0 0``: every listed pair is relevant, with
  zero-padded query ids ("01"). Binary relevance maps to one grade, 3 by default
  (``relevant_grade``); 12 of the 64 queries have no relevant document at all.
"""

from __future__ import annotations

import re
from pathlib import Path

from .dataset import Dataset, Document, Judgment, Query
from .errors import DataFormatError
from .querytypes import length_type
from .smart import parse_smart
from .textfile import read_lines, require_file

DOCS_FILE = "cacm.all"
QUERIES_FILE = "query.text"
QRELS_FILE = "qrels.text"
SHORT_MAX_WORDS = 12

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_ISSUE = re.compile(r"\b(" + "|".join(_MONTHS) + r")[a-z]*\.?\s*,?\s*(19\d\d)\b", re.IGNORECASE)


def issue_date(note: str) -> str | None:
    """``YYYY-MM-01`` from a ``.B`` issue note, or None when it has no month and year."""
    match = _ISSUE.search(note)
    if not match:
        return None
    month = _MONTHS.index(match.group(1).lower()) + 1
    return f"{match.group(2)}-{month:02d}-01"


def load_documents(path: Path) -> list[Document]:
    documents = []
    for record in parse_smart(path, "TWBANXKC"):
        authors = [" ".join(line.split()) for line in record.fields.get("A", "").splitlines() if line.strip()]
        attributes = {"authors": authors, "keywords": record.text("K")}
        documents.append(
            Document(record.record_id, record.text("T"), record.text("W"), issue_date(record.text("B")), attributes)
        )
    return documents


def load_cacm_queries(src: Path, short_max_words: int = SHORT_MAX_WORDS) -> list[Query]:
    path = require_file(src, QUERIES_FILE)
    queries = []
    for record in parse_smart(path, "WAN"):
        text = record.text("W")
        if not text:
            raise DataFormatError.at(
                path,
                record.line,
                f"query .I {record.record_id} has no '.W' text",
                "add the query text under a '.W' line",
            )
        queries.append(Query(str(int(record.record_id)), text, length_type(text, short_max_words), "cacm"))
    return queries


def load_qrels(path: Path, relevant_grade: int, query_ids: set[str]) -> list[Judgment]:
    judgments: dict[tuple[str, str], Judgment] = {}
    for number, line in enumerate(read_lines(path), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            key = (str(int(parts[0])), str(int(parts[1])))
        except (ValueError, IndexError):
            raise DataFormatError.at(
                path, number, f"expected 'qid docid 0 0', got {line.strip()!r}", "each line starts with two integers"
            ) from None
        if key[0] not in query_ids:
            raise DataFormatError.at(
                path,
                number,
                f"query {parts[0]} is not in {QUERIES_FILE}",
                f"use the {QUERIES_FILE} that belongs to these qrels",
            )
        judgments[key] = Judgment(key[0], key[1], relevant_grade)
    return list(judgments.values())


def import_cacm(src: Path, *, relevant_grade: int = 3, short_max_words: int = SHORT_MAX_WORDS) -> Dataset:
    if relevant_grade not in (1, 2, 3):
        raise DataFormatError.at(
            "--relevant-grade",
            None,
            f"{relevant_grade} is not 1, 2 or 3",
            "pass the grade a judged-relevant CACM document gets (default 3)",
        )
    documents = load_documents(require_file(src, DOCS_FILE))
    queries = load_cacm_queries(src, short_max_words)
    judgments = load_qrels(require_file(src, QRELS_FILE), relevant_grade, {q.query_id for q in queries})
    manifest = {
        "source": str(src),
        "grade_mapping": {"name": "binary", "codes": {"relevant": relevant_grade, "unlisted": 0}},
        "date_rule": "YYYY-MM-01 from the issue month and year in the .B field",
        "query_type_rule": f"short: <= {short_max_words} words, else long_tail",
    }
    return Dataset("cacm", documents, queries, judgments, manifest)
