"""Run files in the three forms retrievers write, and their canonical TREC rewrite.

* TREC: ``qid Q0 docno rank score tag`` (whitespace separated).
* JSONL: one ``{"query_id", "results": [{"doc_id", "score"}, ...]}`` per line.
* JSON array (as pyserini writes): ``[{"hits": [{"qid", "docid", "rank", "score", ...}]}, ...]``
  with one object per query; a hit without ``qid`` takes its object's ``qid`` / ``query_id``.

A JSON or JSONL hit may carry its passage (``text``, ``contents``, ``content``,
``passage`` or ``raw``, a ``raw`` JSON document read for its own ``contents`` / ``text``;
``title`` optional), as RankGPT / rank_llm and pyserini write them: the ``files`` importer
builds the corpus from those passages when it is given no corpus file.

The format is told by the first non-blank character (``[`` JSON array, ``{`` JSONL,
else TREC). The rewrite keeps every score at full precision (``repr`` of the float,
which parses back to the same float): six significant digits turned distinct scores
into ties and reordered real runs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DataFormatError
from .textfile import decode, json_object, read_bytes, split_lines, split_rows

_RUN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class RunLine:
    query_id: str
    doc_id: str
    score: float
    tag: str
    text: str | None = None  # the hit's passage, when the run carries it (JSON / JSONL)
    title: str | None = None


_PASSAGE_KEYS = ("text", "contents", "content", "passage", "raw")


def run_name(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` or ``PATH`` (name = file stem); the name becomes a backend source name."""
    name, sep, path = spec.partition("=")
    if not sep:
        path, name = spec, Path(spec).stem
    if not _RUN_NAME.fullmatch(name):
        raise DataFormatError.at(
            "--run",
            None,
            f"run name {name!r} is not [A-Za-z][A-Za-z0-9_-]*",
            "pass --run NAME=PATH with a simple name starting with a letter",
        )
    return name, Path(path)


def read_run(path: Path, name: str) -> list[RunLine]:
    """Any of the three forms; ``name`` is the tag of runs that carry none (JSON)."""
    text = decode(read_bytes(path))
    first = text.lstrip()[:1]
    if first == "[":
        lines = list(_json_array(path, text, name))
    elif first == "{":
        lines = list(_jsonl(path, split_lines(text), name))
    else:
        lines = list(_trec(path, split_lines(text)))
    if not lines:
        raise DataFormatError.at(path, None, "the run holds no result lines", "pass a run file with results")
    return lines


def parse_trec_run(path: Path) -> list[RunLine]:
    return list(_trec(path, split_lines(decode(read_bytes(path)))))


def _trec(path: Path, lines: list[str]) -> Iterator[RunLine]:
    seen: dict[tuple[str, str], int] = {}
    for number, parts in split_rows(lines):
        if len(parts) != 6:
            raise DataFormatError.at(
                path,
                number,
                f"expected 6 columns 'qid Q0 docno rank score tag', got {len(parts)}",
                "write run lines in TREC format",
            )
        _unique(seen, parts[0], parts[2], path, number)
        yield RunLine(parts[0], parts[2], _score(parts[4], path, number), parts[5])


def _jsonl(path: Path, lines: list[str], name: str) -> Iterator[RunLine]:
    seen: dict[tuple[str, str], int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = json_object(path, number, line, 'write {"query_id": ..., "results": [...]}')
        qid = _field(record, ("query_id", "qid"), path, number, 'write {"query_id": ..., "results": [...]}')
        results = record.get("results")
        if not isinstance(results, list):
            raise DataFormatError.at(
                path,
                number,
                "record has no 'results' list",
                'write {"query_id": ..., "results": [{"doc_id": ..., "score": ...}]}',
            )
        for hit in results:
            yield _hit(hit, qid, name, seen, path, number)


def _json_array(path: Path, text: str, name: str) -> Iterator[RunLine]:
    data = _json(text, path, None)
    if not isinstance(data, list):
        raise DataFormatError.at(
            path, None, "a JSON run must be a list of per-query objects", 'write [{"qid": ..., "hits": [...]}, ...]'
        )
    seen: dict[tuple[str, str], int] = {}
    for index, entry in enumerate(data, start=1):
        hits = entry.get("hits") if isinstance(entry, dict) else None
        if not isinstance(hits, list):
            raise DataFormatError.at(
                path,
                None,
                f"query object {index} has no 'hits' list",
                'give every object a "hits": [{"qid", "docid", "score"}] list',
            )
        default_qid = _query_of(entry)
        for hit in hits:
            qid = str(hit.get("qid", default_qid or "")) if isinstance(hit, dict) else ""
            if not qid:
                raise DataFormatError.at(
                    path, None, f"query object {index}: a hit has no 'qid'", "give each hit (or its query object) a qid"
                )
            yield _hit(hit, qid, name, seen, path, None)


def _query_of(entry: dict[str, Any]) -> str | None:
    for key in ("qid", "query_id"):
        if entry.get(key) is not None:
            return str(entry[key])
    query = entry.get("query")
    return str(query["qid"]) if isinstance(query, dict) and query.get("qid") is not None else None


def _hit(hit: Any, qid: str, tag: str, seen: dict[tuple[str, str], int], path: Path, line: int | None) -> RunLine:
    fix = 'write each result as {"doc_id": ..., "score": ...}'
    if not isinstance(hit, dict):
        raise DataFormatError.at(path, line, f"query {qid}: a result is not an object", fix)
    doc_id = _field(hit, ("doc_id", "docid"), path, line, fix, f"query {qid}: ")
    if "score" not in hit:
        raise DataFormatError.at(path, line, f"query {qid}: result {doc_id} has no 'score'", fix)
    _unique(seen, qid, doc_id, path, line)
    title = hit.get("title")
    return RunLine(
        qid,
        doc_id,
        _score(hit["score"], path, line),
        tag,
        _passage(hit),
        " ".join(title.split()) if isinstance(title, str) else None,
    )


def _passage(hit: dict[str, Any]) -> str | None:
    """The hit's passage text, None when it carries none."""
    for key in _PASSAGE_KEYS:
        value = hit.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        if key == "raw" and value.lstrip().startswith("{"):  # pyserini: the indexed JSON document
            try:
                doc = json.loads(value)
            except json.JSONDecodeError:
                doc = None
            if isinstance(doc, dict):
                inner = next((doc[k] for k in ("contents", "text") if isinstance(doc.get(k), str)), None)
                if inner is None:
                    continue
                value = inner
        return " ".join(value.split())
    return None


def _field(
    record: dict[str, Any], keys: tuple[str, ...], path: Path, line: int | None, fix: str, prefix: str = ""
) -> str:
    for key in keys:
        value = record.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    raise DataFormatError.at(path, line, f"{prefix}no {' or '.join(repr(k) for k in keys)}", fix)


def _json(text: str, path: Path, line: int | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = line if line is not None else exc.lineno
        raise DataFormatError.at(path, where, f"invalid JSON ({exc.msg})", "fix the JSON syntax") from exc


def _score(raw: Any, path: Path, line: int | None) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not math.isfinite(value):
        raise DataFormatError.at(
            path, line, f"score {raw!r} is not a finite number", "give every result a numeric score"
        )
    return value


def _unique(seen: dict[tuple[str, str], int], qid: str, doc_id: str, path: Path, line: int | None) -> None:
    key = (qid, doc_id)
    if key in seen:
        first = f" (first on line {seen[key]})" if seen[key] else ""
        raise DataFormatError.at(
            path, line, f"document {doc_id} listed twice for query {qid}{first}", "keep one line per query and document"
        )
    seen[key] = line or 0


def render_run(lines: Iterable[RunLine], query_order: list[str]) -> str:
    """Canonical run text: queries in ``query_order`` (unknown ones after, sorted), score
    descending, ties by docno descending (trec_eval's order), ranks from 1, scores exact."""
    order = {qid: i for i, qid in enumerate(query_order)}
    by_query: dict[str, list[RunLine]] = {}
    for line in lines:
        by_query.setdefault(line.query_id, []).append(line)
    out = []
    for qid in sorted(by_query, key=lambda q: (order.get(q, len(order)), q)):
        ranked = sorted(by_query[qid], key=lambda r: r.doc_id, reverse=True)
        ranked.sort(key=lambda r: r.score, reverse=True)
        out += [f"{qid} Q0 {r.doc_id} {rank} {r.score!r} {r.tag}\n" for rank, r in enumerate(ranked, start=1)]
    return "".join(out)


@dataclass(frozen=True)
class ConvertedRuns:
    """Runs rewritten for the service: bundle files, paths and parsed lines by source name."""

    files: dict[str, str]
    paths: dict[str, str]
    sources: dict[str, Path]
    lines: dict[str, list[RunLine]]

    @property
    def doc_ids(self) -> list[str]:
        return [line.doc_id for lines in self.lines.values() for line in lines]

    def passages(self) -> dict[str, RunLine]:
        """doc id -> the first line (in run order) carrying its passage text."""
        out: dict[str, RunLine] = {}
        for lines in self.lines.values():
            for line in lines:
                if line.text is not None and line.doc_id not in out:
                    out[line.doc_id] = line
        return out

    def ranked_queries(self) -> set[str]:
        """The query ids some run lists results for."""
        return {line.query_id for lines in self.lines.values() for line in lines}


def convert_runs(specs: list[str], query_order: list[str]) -> ConvertedRuns:
    converted = ConvertedRuns({}, {}, {}, {})
    for spec in specs:
        name, path = run_name(spec)
        if name in converted.paths:
            raise DataFormatError.at("--run", None, f"run name {name!r} given twice", "give each run its own name")
        converted.lines[name] = read_run(path, name)
        converted.sources[name] = path
        converted.paths[name] = f"runs/{name}.run"
        converted.files[converted.paths[name]] = render_run(converted.lines[name], query_order)
    return converted
