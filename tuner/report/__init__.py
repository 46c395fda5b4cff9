"""Reports of a batch evaluation: JSON (the record), Markdown (for people), a
per-query CSV and the handoff precision-recall curve (PNG).

``write_reports(result, out_dir, context=..., config_snapshot=..., detail="full"|"slim") -> ReportPaths``:
``full`` for ``tuner eval``, a study's baseline and best trials and ``tuner apply``;
``slim`` (no per-query top-20 snapshots or unjudged list, a short Markdown) for other trials.
"""

from tuner.files import atomic_write_bytes, atomic_write_text
from tuner.report.build import DETAILS, Detail, build_report, label_sequence, per_query_table
from tuner.report.context import REPORT_SCHEMA, ReportContext
from tuner.report.markdown import render_markdown
from tuner.report.plots import pr_curve_figure, pr_curve_png
from tuner.report.writer import ReportPaths, dumps_json, load_report, write_reports

__all__ = [
    "DETAILS",
    "REPORT_SCHEMA",
    "Detail",
    "ReportContext",
    "ReportPaths",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_report",
    "dumps_json",
    "label_sequence",
    "load_report",
    "per_query_table",
    "pr_curve_figure",
    "pr_curve_png",
    "render_markdown",
    "write_reports",
]
