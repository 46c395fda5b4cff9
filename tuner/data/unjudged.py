"""Unjudged (query, doc) pairs: which hits still lack a label, written out for graders
as CSV or JSONL files that import back into the label cache once graded."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tuner.data.labelfiles import detect_format
from tuner.errors import InputError
from tuner.files import atomic_write_text

#: the files graders get: CSV or JSONL (tuner labels export-unjudged, tuner label-queue)
ExportFormat = Literal["csv", "jsonl"]


def export_format(fmt: str | None) -> ExportFormat | None:
    """A ``--format`` option as the writers take it (None: from the file's extension)."""
    if fmt is None:
        return None
    if fmt == "csv":
        return "csv"
    if fmt == "jsonl":
        return "jsonl"
    raise InputError(f"--format {fmt!r}: use csv or jsonl")


@dataclass(frozen=True, slots=True)
class UnjudgedPair:
    """A (query, doc) pair a grader should label."""

    query_id: str
    doc_id: str
    title: str | None = None
    query: str | None = None
    best_rank: int | None = None


def unjudged_pairs(
    hits: Iterable[Mapping[str, Any]],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    queries: Mapping[str, str] | None = None,
) -> list[UnjudgedPair]:
    """Deduplicated (query, doc) pairs from ``hits`` (mappings with query_id, doc_id and
    optionally title, rank) that have no label in ``qrels``; first-seen order, best rank kept."""
    qrels = qrels or {}
    pairs: dict[tuple[str, str], UnjudgedPair] = {}
    for hit in hits:
        qid, doc = str(hit["query_id"]), str(hit["doc_id"])
        if doc in qrels.get(qid, {}):
            continue
        rank = hit.get("rank")
        prior = pairs.get((qid, doc))
        title = hit.get("title") if prior is None or prior.title is None else prior.title
        best = (
            rank
            if prior is None or prior.best_rank is None
            else (prior.best_rank if rank is None else min(prior.best_rank, rank))
        )
        query = (queries or {}).get(qid) or hit.get("query")
        pairs[(qid, doc)] = UnjudgedPair(qid, doc, title, query, best)
    return list(pairs.values())


def export_unjudged(
    hits: Iterable[Mapping[str, Any]],
    out: str | Path,
    *,
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    fmt: Literal["csv", "jsonl"] | None = None,
    queries: Mapping[str, str] | None = None,
) -> int:
    """Write unjudged pairs for graders, atomically. CSV: ``query_id,query,doc_id,title,relevance``
    with relevance left blank; JSONL: one object per query with ``judgments`` whose
    ``relevance`` is null. Both import back once the relevance values are filled in."""
    target = Path(out)
    fmt = fmt or ("jsonl" if detect_format(target) == "jsonl" else "csv")
    if fmt not in ("csv", "jsonl"):
        raise InputError(f"{target}: unknown export format {fmt!r}; use csv or jsonl")
    pairs = unjudged_pairs(hits, qrels, queries)
    if fmt == "csv":
        buf = io.StringIO(newline="")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["query_id", "query", "doc_id", "title", "relevance"])
        for p in pairs:
            writer.writerow([p.query_id, p.query or "", p.doc_id, p.title or "", ""])
        text = buf.getvalue()
    else:
        grouped: dict[str, list[UnjudgedPair]] = {}
        for p in pairs:
            grouped.setdefault(p.query_id, []).append(p)
        lines = [
            json.dumps(
                {
                    "query_id": qid,
                    "query": group[0].query,
                    "judgments": [{"doc_id": p.doc_id, "title": p.title, "relevance": None} for p in group],
                },
                ensure_ascii=False,
            )
            for qid, group in grouped.items()
        ]
        text = "".join(line + "\n" for line in lines)
    atomic_write_text(target, text)
    return len(pairs)
