"""Write a batch's reports to a directory: JSON, Markdown, per-query CSV, PR curve.

``detail="full"`` (``tuner eval``, a study's baseline and best trials, ``tuner apply``)
writes everything; ``detail="slim"`` (a study's other trials) leaves out the per-query
top-20 snapshots and the unjudged-hit list and writes a short Markdown summary and a
narrower per-query CSV (tuner.report.build.SLIM_CSV_COLUMNS), and no PR-curve PNG: the
plot was 110 ms of CPU per trial, more than the rest of the report together, and its
data is the JSON's ``threshold_sweep``. The JSON is indented in both, so it previews
and diffs line by line.

Every file is written atomically; the JSON report (the machine-readable index of the
others) is written last, so its presence means the set is complete. Each text is
scrubbed of the secret values this process has read (tuner.secrets.scrub_known) on
its way out: a backend that echoes a token, or a config snapshot that holds one, does
not put it on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tuner.errors import InputError
from tuner.files import atomic_write_bytes, atomic_write_text
from tuner.report.build import Detail, build_report, check_detail, per_query_table
from tuner.report.context import REPORT_SCHEMA, ReportContext
from tuner.report.markdown import render_markdown
from tuner.report.plots import pr_curve_png
from tuner.secrets import scrub_known

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult


#: the PR-curve PNG of a report: drawn, referenced as already there (a superseded best
#: trial rewritten slim keeps the curve it was drawn with), or left out
PrCurve = Literal["draw", "keep", "omit"]


def pr_curve_action(detail: Detail, pr_curve: PrCurve | None = None) -> PrCurve:
    """What ``write_reports`` does with the PR curve: ``pr_curve``, else drawn for a full
    report and left out of a slim one."""
    return pr_curve if pr_curve is not None else "draw" if detail == "full" else "omit"


@dataclass(frozen=True)
class ReportPaths:
    json: Path
    markdown: Path
    per_query_csv: Path
    pr_curve_png: Path | None


#: float format of a slim per-query CSV (10 significant digits; a full CSV keeps every digit)
SLIM_CSV_FLOAT_FORMAT = "%.10g"


def write_reports(
    result: BatchResult,
    out_dir: str | Path,
    *,
    context: ReportContext | None = None,
    config_snapshot: str | None = None,
    stem: str = "report",
    detail: Detail = "full",
    markdown: Detail | None = None,
    pr_curve: PrCurve | None = None,
) -> ReportPaths:
    """Write ``{stem}.json``, ``{stem}.md``, ``{stem}_per_query.csv`` and, when the
    responses carried a confidence, ``{stem}_pr_curve.png`` into ``out_dir``
    (``detail``: see the module doc; ``pr_curve``: see ``pr_curve_action``). ``markdown``
    (default: ``detail``): a study's trials keep the short Markdown even when their JSON
    holds every query's top-k snapshot."""
    check_detail(detail)
    action = pr_curve_action(detail, pr_curve)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(result, context, config_snapshot=config_snapshot, detail=detail)
    paths = ReportPaths(
        json=out / f"{stem}.json",
        markdown=out / f"{stem}.md",
        per_query_csv=out / f"{stem}_per_query.csv",
        pr_curve_png=None if result.threshold_sweep is None or action == "omit" else out / f"{stem}_pr_curve.png",
    )
    if paths.pr_curve_png is not None and result.threshold_sweep is not None and action == "draw":
        png = pr_curve_png(
            result.threshold_sweep, title=f"Handoff: {result.dataset_id}", threshold=result.threshold_in_effect
        )
        atomic_write_bytes(paths.pr_curve_png, png)
    csv_text = per_query_table(result, detail).to_csv(
        index=True, lineterminator="\n", float_format=SLIM_CSV_FLOAT_FORMAT if detail == "slim" else None
    )
    atomic_write_text(paths.per_query_csv, scrub_known(csv_text))
    pr_name = paths.pr_curve_png.name if paths.pr_curve_png is not None else None
    md_report = (
        report
        if (markdown or detail) == detail
        else build_report(result, context, config_snapshot=config_snapshot, detail=markdown or detail)
    )
    if md_report is not report and detail == "full":
        # the short Markdown of a full report (a study's baseline and best trials): it
        # must not call the report slim nor send people to "the full reports" elsewhere
        md_report = {
            **md_report,
            "coverage": report["coverage"],
            "detail_note": summary_note(paths.json.name, paths.per_query_csv.name),
        }
    atomic_write_text(paths.markdown, scrub_known(render_markdown(md_report, pr_curve=pr_name)))
    report["files"] = {
        "markdown": paths.markdown.name,
        "per_query_csv": paths.per_query_csv.name,
        "pr_curve_png": pr_name,
    }
    atomic_write_text(paths.json, scrub_known(dumps_json(report)) + "\n")
    return paths


def summary_note(json_name: str, csv_name: str) -> str:
    """The header note of a full report's short Markdown: where its full data is."""
    return (
        f"full report, summarised here: every query's top-20 snapshot and all unjudged hits are in {json_name}, "
        f"every query's row in {csv_name}"
    )


#: ``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))``, its
#: encoder made once: json.dumps builds a new one per call when given options, and a
#: report's JSON is thousands of calls (the demo's full trial report 73 thousand)
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": ")).encode


def dumps_json(value: Any, *, _level: int = 0) -> str:
    """JSON indented by one space per level, each innermost object or list (a sweep row,
    a query's hit) on one line: readable in artifact previews and line diffs. Measured on
    the demo's full trial report: 61 ms, 1.15 MB (one line: 15 ms, 1.11 MB; ``indent=1``:
    74 ms, 1.33 MB); on its slim one, 1 ms and 48 KB."""
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    if children is None or not value:
        return _encode(value)
    for child in children:
        if isinstance(child, (dict, list)):
            break
    else:
        return _encode(value)
    pad, end = "\n" + " " * (_level + 1), "\n" + " " * _level
    if isinstance(value, dict):
        body = ",".join(f"{pad}{_encode(str(k))}: {dumps_json(v, _level=_level + 1)}" for k, v in value.items())
        return "{" + body + end + "}"
    return "[" + ",".join(pad + dumps_json(v, _level=_level + 1) for v in value) + end + "]"


def load_report(path: str | Path, *, full: bool = False) -> dict[str, Any]:
    """Read a JSON report written by write_reports; InputError when it is not one, or
    with ``full`` when it is a slim report (no per-query entries, no unjudged list)."""
    p = Path(path)
    try:
        report = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{p}: report not found; pass the report.json a `tuner eval` run wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{p}: not a readable JSON report ({exc}); pass the report.json of `tuner eval`") from exc
    if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise InputError(f"{p}: not a fusion-tuner evaluation report (schema {found!r}, expected {REPORT_SCHEMA!r})")
    if full and report.get("detail") == "slim":
        raise InputError(
            f"{p}: a slim trial report without per-query hits; pass a full report (the baseline's, "
            "a best trial's, or one written by `tuner eval` or `tuner apply`)"
        )
    return report
