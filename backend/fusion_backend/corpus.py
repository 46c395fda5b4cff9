"""Reading the corpus JSONL: one ``{doc_id, title, text, date, ...}`` per line.

Dates are kept as day numbers (days since 1970-01-01) in a numpy array so date windows
are one vectorised comparison per request; an undated document gets ``NO_DATE`` and
falls outside every window (it is found only by the ``no_filter`` tier).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CorpusError

NO_DATE = np.iinfo(np.int32).min
EPOCH = dt.date(1970, 1, 1)


def day_number(day: dt.date) -> int:
    return (day - EPOCH).days


@dataclass(frozen=True)
class Corpus:
    """Documents in file order; the position is the document's index everywhere."""

    doc_ids: list[str]
    titles: list[str]
    texts: list[str]
    dates: list[str | None]
    days: np.ndarray  # int32 day numbers, NO_DATE when undated
    content_hash: str

    def __len__(self) -> int:
        return len(self.doc_ids)

    def index_of(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.doc_ids)}

    def search_text(self, i: int) -> str:
        return f"{self.titles[i]}\n{self.texts[i]}"


def read_corpus(path: Path) -> Corpus:
    """Parse and hash ``path`` in one pass; ``CorpusError`` names file:line on bad input."""
    digest = hashlib.sha256()
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    dates: list[str | None] = []
    days: list[int] = []
    seen: set[str] = set()
    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                digest.update(line)
                if not line.strip():
                    continue
                doc_id, title, text, date = _parse_line(path, lineno, line)
                if doc_id in seen:
                    raise CorpusError(f"{path}:{lineno}: duplicate doc_id {doc_id!r}: doc ids must be unique")
                seen.add(doc_id)
                ids.append(doc_id)
                titles.append(title)
                texts.append(text)
                dates.append(date)
                days.append(NO_DATE if date is None else day_number(dt.date.fromisoformat(date)))
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read corpus: {exc.strerror}") from exc
    if not ids:
        raise CorpusError(f"{path}: the corpus is empty: write at least one {{doc_id, title, text, date}} line")
    return Corpus(ids, titles, texts, dates, np.asarray(days, dtype=np.int32), digest.hexdigest())


def _parse_line(path: Path, lineno: int, line: bytes) -> tuple[str, str, str, str | None]:
    where = f"{path}:{lineno}"
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{where}: not a JSON object ({exc}); one document per line") from exc
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}: expected a JSON object {{doc_id, title, text, date}}")
    doc_id = rec.get("doc_id")
    if not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        raise CorpusError(f"{where}: doc_id is missing or empty")
    title, text = rec.get("title") or "", rec.get("text") or ""
    if not isinstance(title, str) or not isinstance(text, str):
        raise CorpusError(f"{where}: title and text must be strings (doc_id {doc_id!r})")
    date = rec.get("date")
    if date is not None:
        if not isinstance(date, str):
            raise CorpusError(f"{where}: date must be 'YYYY-MM-DD' or null (doc_id {doc_id!r})")
        date = date[:10]
        try:
            dt.date.fromisoformat(date)
        except ValueError as exc:
            raise CorpusError(f"{where}: date {rec['date']!r} is not YYYY-MM-DD (doc_id {doc_id!r})") from exc
    return str(doc_id), title, text, date
