"""The labelling queue: what graders should judge next, and bringing their grades back.

A study's best trials surface documents nobody has graded; the scorecard counts them
as Irrelevant, so a trial can look worse (or, against a baseline whose unjudged hits
hide judged ones, better) than it is. The queue pools the unjudged top-k hits of the
best feasible trials (and the baseline), one row per (query, document), most useful
first: hits shown by more of those trials first, then by best rank. Graders fill in
``relevance`` (0..3) on as many rows as they like; ``import_graded`` imports the graded
rows into the label cache and leaves the blank ones for the next round.

Sources are the trials' JSON reports (``unjudged``: query_id, rank, doc_id, title), so
the queue needs no backend.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.data.labelfiles import detect_format, read_judgments
from tuner.data.labels import ImportSummary, LabelStore
from tuner.data.unjudged import ExportFormat
from tuner.errors import InputError
from tuner.files import atomic_write_text
from tuner.ops import analysis
from tuner.study.trial.attrs import reports_of

CSV_COLUMNS = ("query_id", "query", "doc_id", "title", "best_rank", "n_trials", "relevance")


@dataclass
class QueueItem:
    """One (query, document) pair to grade, with why it is in the queue."""

    query_id: str
    doc_id: str
    query: str = ""
    title: str = ""
    best_rank: int = 0
    trials: list[int] = field(default_factory=list)

    @property
    def n_trials(self) -> int:
        return len(self.trials)


@dataclass(frozen=True)
class TrialReport:
    """The part of a trial's JSON report the queue reads."""

    number: int
    unjudged: Sequence[Mapping[str, Any]]
    queries: Mapping[str, str]  # query_id -> query text
    dataset_id: str | None = None
    depth: int | None = None  # a slim trial report lists unjudged hits down to this rank only


def pick_trials(
    trials: Sequence[Any], *, top_n: int, maximize: bool = True, include_baseline: bool = True
) -> list[Any]:
    """The ``top_n`` best feasible trials (COMPLETE, every constraint <= 0), best first,
    plus the baseline (variant "baseline") when it is not among them."""
    frame = analysis.trials_frame(trials)
    ranked = analysis.feasible_ranked(frame[frame["value"].notna()], maximize=maximize)
    numbers = [int(n) for n in ranked["number"].head(top_n)]
    if include_baseline:
        numbers += [int(n) for n in frame.loc[frame["variant"] == "baseline", "number"] if n not in numbers]
    by_number = {t.number: t for t in trials}
    return [by_number[int(n)] for n in numbers]


def report_of(trial: Any) -> Path | None:
    """The JSON report a trial recorded (its ``reports`` record), if any."""
    reports = reports_of(trial)
    path = reports.get("json")
    return Path(path) if path else None


def load_trial_report(number: int, path: Path) -> TrialReport:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"trial {number}: report {path} is missing; re-run the trial or drop it with --top") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"trial {number}: cannot read report {path} ({exc})") from exc
    queries = {str(q["query_id"]): str(q.get("query") or "") for q in data.get("queries") or []}
    queries = queries or {str(k): str(v) for k, v in (data.get("query_texts") or {}).items()}
    dataset_id = (data.get("context") or {}).get("dataset_id")
    return TrialReport(number, data.get("unjudged") or [], queries, dataset_id, data.get("unjudged_depth"))


def build_queue(
    reports: Iterable[TrialReport],
    *,
    k: int = 10,
    qrels: Mapping[str, Mapping[str, int]] | None = None,
) -> list[QueueItem]:
    """Pool the unjudged hits at rank <= k, drop pairs ``qrels`` already grades, and
    order by (more trials showing it, better best rank, query id, doc id)."""
    if k < 1:
        raise InputError(f"--k {k}: the depth of the pool must be >= 1")
    qrels = qrels or {}
    items: dict[tuple[str, str], QueueItem] = {}
    reports = list(reports)
    shallow = [r.number for r in reports if r.depth is not None and r.depth < k]
    if shallow:
        raise InputError(
            f"--k {k}: the slim reports of trial(s) {', '.join(f'#{n}' for n in shallow)} list unjudged hits down to "
            f"rank {min(r.depth for r in reports if r.depth is not None)} only; use --k "
            f"{min(r.depth for r in reports if r.depth is not None)} or set tracking.report_detail: full and re-run"
        )
    for report in reports:
        for hit in report.unjudged:
            if hit.get("rank") is None or int(hit["rank"]) > k:
                continue
            rank = int(hit["rank"])
            qid, doc = str(hit["query_id"]), str(hit["doc_id"])
            if doc in qrels.get(qid, {}):
                continue
            item = items.get((qid, doc))
            if item is None:
                item = items[(qid, doc)] = QueueItem(qid, doc, report.queries.get(qid, ""), "", rank)
            item.best_rank = min(item.best_rank, rank)
            item.title = item.title or _one_line(hit.get("title"))
            item.query = item.query or report.queries.get(qid, "")
            if report.number not in item.trials:
                item.trials.append(report.number)
    return sorted(items.values(), key=lambda i: (-i.n_trials, i.best_rank, i.query_id, i.doc_id))


def write_queue(items: Sequence[QueueItem], out: str | Path, fmt: ExportFormat | None = None) -> int:
    """Write the queue atomically; CSV or JSONL (one object per query), ``relevance``
    left blank / null. Both import back with ``import_graded`` (and, fully graded,
    with ``tuner labels import``)."""
    target = Path(out)
    fmt = fmt or ("jsonl" if detect_format(target) == "jsonl" else "csv")
    if fmt == "csv":
        buf = io.StringIO(newline="")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for i in items:
            writer.writerow([i.query_id, _one_line(i.query), i.doc_id, i.title, i.best_rank, i.n_trials, ""])
        text = buf.getvalue()
    elif fmt == "jsonl":
        grouped: dict[str, list[QueueItem]] = {}
        for i in items:
            grouped.setdefault(i.query_id, []).append(i)
        text = "".join(
            json.dumps(
                {
                    "query_id": qid,
                    "query": group[0].query,
                    "judgments": [
                        {
                            "doc_id": i.doc_id,
                            "title": i.title,
                            "best_rank": i.best_rank,
                            "n_trials": i.n_trials,
                            "relevance": None,
                        }
                        for i in group
                    ],
                },
                ensure_ascii=False,
            )
            + "\n"
            for qid, group in grouped.items()
        )
    else:
        raise InputError(f"{target}: unknown queue format {fmt!r}; use csv or jsonl")
    atomic_write_text(target, text)
    return len(items)


def import_graded(store: LabelStore, path: str | Path, dataset_id: str) -> tuple[ImportSummary | None, int]:
    """Import the rows graders filled in; rows whose relevance is still blank / null are
    skipped. Returns (summary or None when nothing was graded, rows still ungraded).
    All or nothing: one bad grade (reported as ``file:line``) imports none."""
    p = Path(path)
    fmt = detect_format(p)
    if fmt not in ("csv", "jsonl"):
        raise InputError(f"{p}: a labelling queue is .csv or .jsonl; for qrels use tuner labels import")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p}: queue file not found; check the path") from None
    graded_text, n_graded, n_blank = (_graded_csv if fmt == "csv" else _graded_jsonl)(text, str(p))
    if n_graded == 0:
        return None, n_blank
    # The label cache's own parser checks the grades; it reads files, so hand it one with the
    # ungraded rows blanked (same line numbers) and point its messages back at the real file.
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / p.name
        staged.write_text(graded_text, encoding="utf-8")
        try:
            judgments = read_judgments(staged, fmt)
        except InputError as exc:
            raise InputError(str(exc).replace(str(staged), str(p))) from exc
    summary = store.import_judgments(
        judgments,
        dataset_id,
        source_file=str(p.resolve()),
        importer=f"queue-{fmt}",
        kind="grader",
        file_sha256=hashlib.sha256(p.read_bytes()).hexdigest(),
    )
    return summary, n_blank


def _graded_csv(text: str, name: str) -> tuple[str, int, int]:
    lines = text.splitlines()
    if not lines:
        raise InputError(f"{name}: empty queue file; export one with tuner labels queue")
    header = next(csv.reader([lines[0]]))
    if "relevance" not in [c.strip() for c in header]:
        raise InputError(f"{name}:1: no relevance column; grade the file tuner labels queue wrote")
    rel = [c.strip() for c in header].index("relevance")
    out, graded, blank = [lines[0]], 0, 0
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        if not any(cell.strip() for cell in row):
            out.append("")
        elif len(row) > rel and not row[rel].strip():
            out.append("")  # ungraded: keep the line so later rows keep their numbers
            blank += 1
        else:
            out.append(line)
            graded += 1
    return "\n".join(out) + "\n", graded, blank


def _graded_jsonl(text: str, name: str) -> tuple[str, int, int]:
    out, graded, blank = [], 0, 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            out.append("")
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno})") from exc
        items = rec.get("judgments") if isinstance(rec, dict) else None
        if not isinstance(items, list):
            out.append(line)  # let the label parser report what is wrong with it
            continue
        kept = [j for j in items if not (isinstance(j, dict) and j.get("relevance") in (None, ""))]
        blank += len(items) - len(kept)
        graded += len(kept)
        out.append(json.dumps({**rec, "judgments": kept}, ensure_ascii=False) if kept else "")
    return "\n".join(out) + "\n", graded, blank


def _one_line(value: Any) -> str:
    return " ".join(str(value or "").split())
