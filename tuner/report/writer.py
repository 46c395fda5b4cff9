"""Write a batch's reports to a directory: JSON, Markdown, per-query CSV, PR curve.

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
from typing import TYPE_CHECKING, Any

from tuner.errors import InputError
from tuner.files import atomic_write_bytes, atomic_write_text
from tuner.report.build import build_report, per_query_table
from tuner.report.context import REPORT_SCHEMA, ReportContext
from tuner.report.markdown import render_markdown
from tuner.report.plots import pr_curve_png
from tuner.secrets import scrub_known

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult


@dataclass(frozen=True)
class ReportPaths:
    json: Path
    markdown: Path
    per_query_csv: Path
    pr_curve_png: Path | None


def write_reports(
    result: BatchResult,
    out_dir: str | Path,
    *,
    context: ReportContext | None = None,
    config_snapshot: str | None = None,
    stem: str = "report",
) -> ReportPaths:
    """Write ``{stem}.json``, ``{stem}.md``, ``{stem}_per_query.csv`` and, when the
    responses carried a confidence, ``{stem}_pr_curve.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(result, context, config_snapshot=config_snapshot)
    paths = ReportPaths(
        json=out / f"{stem}.json",
        markdown=out / f"{stem}.md",
        per_query_csv=out / f"{stem}_per_query.csv",
        pr_curve_png=None if result.threshold_sweep is None else out / f"{stem}_pr_curve.png",
    )
    if paths.pr_curve_png is not None and result.threshold_sweep is not None:
        atomic_write_bytes(paths.pr_curve_png, pr_curve_png(result.threshold_sweep, title=f"Handoff: {result.dataset_id}"))
    atomic_write_text(paths.per_query_csv, scrub_known(per_query_table(result).to_csv(index=True, lineterminator="\n")))
    pr_name = paths.pr_curve_png.name if paths.pr_curve_png is not None else None
    atomic_write_text(paths.markdown, scrub_known(render_markdown(report, pr_curve=pr_name)))
    report["files"] = {
        "markdown": paths.markdown.name,
        "per_query_csv": paths.per_query_csv.name,
        "pr_curve_png": pr_name,
    }
    # no indent: json's C encoder only runs without one (~10x faster on a per-trial report)
    atomic_write_text(paths.json, scrub_known(json.dumps(report, ensure_ascii=False, allow_nan=False)) + "\n")
    return paths


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a JSON report written by write_reports; InputError when it is not one."""
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
    return report
