"""Reports of a batch evaluation: JSON (the record), Markdown (for people), a
per-query CSV and the handoff precision-recall curve (PNG).

``write_reports(result, out_dir, context=..., config_snapshot=...) -> ReportPaths``.
"""

from tuner.files import atomic_write_bytes, atomic_write_text
from tuner.report.build import build_report, label_sequence, per_query_table
from tuner.report.context import REPORT_SCHEMA, ReportContext
from tuner.report.markdown import render_markdown
from tuner.report.plots import pr_curve_png
from tuner.report.writer import ReportPaths, load_report, write_reports

__all__ = [
    "REPORT_SCHEMA",
    "ReportContext",
    "ReportPaths",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_report",
    "label_sequence",
    "load_report",
    "per_query_table",
    "pr_curve_png",
    "render_markdown",
    "write_reports",
]
