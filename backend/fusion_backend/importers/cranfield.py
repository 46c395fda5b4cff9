"""Cranfield 1400: aeronautics abstracts, 225 queries, Cleverdon's graded judgments.

Facts that bite, all handled here:

* ``cranqrel`` numbers queries 1..225 by their POSITION in ``cran.qry``, whose own
  ``.I`` ids skip numbers (001, 002, 004, 008, ...). Query ids in the bundle are the
  positions, so they match the qrels; the manifest maps them back to the ``.I`` ids.
* The files use CRLF, except where they do not (cranqrel's last line has no
  terminator; other copies mix LF in): lines are split on LF and a CR dropped.
* The ``.B`` field is a bibliographic note that often holds a year ("j. ae. scs. 25,
  1958, 324."), sometimes a report number that looks like one ("naca tn.1851, 1949.")
  or nothing dated at all ("university of manchester"): the date is YYYY-01-01 from the
  LAST plausible year token (1900..1979, not glued to a dot or a letter), else null.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .cacm import load_cacm_queries
from .dataset import Dataset, Document, Judgment, Query
from .errors import DataFormatError
from .grades import CLEVERDON, GradeMap
from .querytypes import length_type
from .smart import parse_smart
from .textfile import read_lines, require_file

DOCS_FILE = "cran.all.1400"
QUERIES_FILE = "cran.qry"
QRELS_FILE = "cranqrel"
SHORT_MAX_WORDS = 12  # about the lower quartile of Cranfield query lengths (median 17)

_YEAR = re.compile(r"(?<![\w.])(19[0-7]\d)(?!\d)")


def year_date(bibliography: str) -> str | None:
    """``YYYY-01-01`` from a ``.B`` note, or None when it names no plausible year."""
    years = _YEAR.findall(bibliography)
    return f"{years[-1]}-01-01" if years else None


def load_documents(path: Path) -> list[Document]:
    documents = []
    for record in parse_smart(path, "TABW"):
        bibliography = record.text("B")
        attributes = {"authors": record.text("A"), "bibliography": bibliography}
        documents.append(
            Document(record.record_id, record.text("T"), record.text("W"), year_date(bibliography), attributes)
        )
    return documents


def load_queries(path: Path, short_max_words: int) -> tuple[list[Query], dict[str, str]]:
    """Queries numbered by position (1..n), and position -> original ``.I`` id."""
    queries, original_ids = [], {}
    for position, record in enumerate(parse_smart(path, "W"), start=1):
        text = record.text("W")
        if not text:
            raise DataFormatError.at(
                path,
                record.line,
                f"query .I {record.record_id} has no '.W' text",
                "add the query text under a '.W' line",
            )
        query_id = str(position)
        original_ids[query_id] = record.record_id
        queries.append(Query(query_id, text, length_type(text, short_max_words), "cranfield"))
    return queries, original_ids


def load_qrels(path: Path, grade_map: GradeMap, n_queries: int) -> list[Judgment]:
    judgments: dict[tuple[str, str], Judgment] = {}
    for number, line in enumerate(read_lines(path), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            position, doc_id, code = int(parts[0]), str(int(parts[1])), int(parts[2])
        except (ValueError, IndexError):
            raise DataFormatError.at(
                path,
                number,
                f"expected 'query_position doc_id code', got {line.strip()!r}",
                "each line holds three integers",
            ) from None
        if not 1 <= position <= n_queries:
            raise DataFormatError.at(
                path,
                number,
                f"query number {position} is outside 1..{n_queries}",
                f"cranqrel numbers queries by position in {QUERIES_FILE}; use the matching query file",
            )
        key = (str(position), doc_id)
        grade = grade_map.grade(code, path, number)
        # A pair judged twice keeps its highest grade (no such pair in the shipped file).
        if key not in judgments or judgments[key].grade < grade:
            judgments[key] = Judgment(key[0], doc_id, grade)
    return list(judgments.values())


def import_cranfield(
    src: Path,
    *,
    grade_map: GradeMap | None = None,
    short_max_words: int = SHORT_MAX_WORDS,
    oos_from_cacm: int = 0,
    cacm_src: Path | None = None,
) -> Dataset:
    """Read the collection in ``src``; optionally append ``oos_from_cacm`` CACM queries as scope oos."""
    grade_map = grade_map or GradeMap(CLEVERDON, "Cleverdon")
    documents = load_documents(require_file(src, DOCS_FILE))
    queries, original_ids = load_queries(require_file(src, QUERIES_FILE), short_max_words)
    judgments = load_qrels(require_file(src, QRELS_FILE), grade_map, len(queries))
    manifest: dict[str, Any] = {
        "source": str(src),
        "grade_mapping": {"name": grade_map.name, "codes": grade_map.describe()},
        "query_id_rule": f"position in {QUERIES_FILE} (1..{len(queries)}), as {QRELS_FILE} numbers them",
        "query_original_ids": original_ids,
        "date_rule": "YYYY-01-01 from the last year 1900..1979 in the .B field, else null",
        "query_type_rule": f"short: <= {short_max_words} words, else long_tail",
    }
    if oos_from_cacm:
        cacm_dir = cacm_src or src.parent / "cacm"
        queries += oos_queries_from_cacm(cacm_dir, oos_from_cacm)
        manifest["oos_queries"] = {
            "source": str(cacm_dir),
            "count": oos_from_cacm,
            "rule": "the first N CACM queries by id, scope oos, ids cacm-<id>",
        }
    return Dataset("cranfield", documents, queries, judgments, manifest)


def oos_queries_from_cacm(cacm_dir: Path, count: int) -> list[Query]:
    """Computing questions: honest out-of-scope queries for an aeronautics corpus."""
    cacm = load_cacm_queries(cacm_dir)
    if not 0 < count <= len(cacm):
        raise DataFormatError.at(
            "--oos-from-cacm",
            None,
            f"{count} is outside 1..{len(cacm)}",
            f"CACM has {len(cacm)} queries; ask for at most that many",
        )
    return [Query(f"cacm-{q.query_id}", q.query, "off_topic", "cacm", scope="oos") for q in cacm[:count]]
