"""`tuner best` on the console: the tables a person picks the winner from.

- trials: the baseline first, then the listed trials; the objective, its change
  against the baseline, a verdict per constraint (``0.0938 ✓ ≤ 0.10``), Judged@10
  and the variant. Headers are short and explained by a legend line, so none is cut.
- parameters: one row per config key, one column per trial (baseline first), values
  that differ from the baseline marked ``*``. Keys are never cut: when the columns do
  not fit the terminal they are split over several tables, the baseline in each.

Cells are `rich.text.Text`, so brackets in values ("[39, 111]") are not read as markup.
On a console that cannot print Unicode the marks become ASCII (ok, X, <=). A row is a
trial's row of tuner.ops.trial_rows (plain dicts: `tuner best` loads no pandas).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuner.numbers import delta, num
from tuner.numbers import value as config_value
from tuner.ops.trial_rows import PARAM_PREFIX
from tuner.ops.verdicts import CONSTRAINT_PREFIX, JUDGED, parse_constraint, verdicts

_ASCII = str.maketrans({"✓": "ok", "✗": "X", "≤": "<=", "≥": ">=", "Δ": "d", "—": "-", "−": "-"})
BASE_MARK = "baseline"
CHANGED = "*"
_BOX_EXTRA = 3  # a column's padding (1 + 1) and its border on the right

Row = Mapping[str, Any]


def trials_table(
    console: Console,
    title: str,
    rows: Sequence[Row],
    *,
    base: Row | None,
    constraint_names: Sequence[str],
    judged: bool,
    deltas: bool = True,
    excess: bool = False,
) -> Table:
    """``rows`` after the baseline row (when ``base`` is given); ``excess``: say by how
    much a broken constraint is broken (the infeasible list)."""
    t = Table(title=title, title_justify="left")
    t.add_column("trial", justify="right", no_wrap=True)
    t.add_column("score", justify="right", no_wrap=True)
    show_delta = deltas and base is not None
    if show_delta:
        t.add_column(_u(console, "Δ base"), justify="right", no_wrap=True)
    for name in constraint_names:
        c = parse_constraint(name)
        t.add_column(c.metric if c is not None else name, no_wrap=True)
    if judged:
        t.add_column(JUDGED, justify="right", no_wrap=True)
    t.add_column("variant", overflow="fold")
    listed = ([base] if base is not None else []) + [r for r in rows if base is None or r["number"] != base["number"]]
    for i, row in enumerate(listed):
        is_base = base is not None and i == 0
        cells = [Text(f"#{int(row['number'])}"), Text(_num(row["value"]))]
        if show_delta and base is not None:  # show_delta implies a base
            cells.append(Text(_u(console, "—")) if is_base else _delta(row["value"], base["value"]))
        by_name = {v.name: v for v in verdicts(row)}
        for name in constraint_names:
            v = by_name.get(name)
            if v is None or not v.known:
                cells.append(Text("-"))
            else:
                cells.append(Text(_u(console, v.text(excess=excess)), style="green" if v.ok else "red"))
        if judged:
            cells.append(Text(_num(row.get(JUDGED))))
        cells.append(Text(_variant(row)))
        t.add_row(*cells, end_section=is_base and len(listed) > 1)
    return t


def legend(console: Console, *, objective: str, base: Row | None, constraints: bool) -> str:
    parts = [f"score = {objective}"]
    if base is not None:
        parts.append(f"Δ base = score − baseline #{int(base['number'])}")
    if constraints:
        parts.append("✓ meets / ✗ breaks the constraint (the metric's value against its bound)")
    return _u(console, "; ".join(parts))


def constraint_names_of(columns: Sequence[str]) -> list[str]:
    """The constraints named by the rows' ``columns`` (tuner.ops.trial_rows.TrialRows)."""
    return [c.removeprefix(CONSTRAINT_PREFIX) for c in columns if c.startswith(CONSTRAINT_PREFIX)]


def early_stops(rows: Sequence[Row]) -> list[str]:
    """One line per listed trial the OOS early stop ended (a COMPLETE, infeasible trial)."""
    return [
        f"#{int(r['number'])} stopped early: {r['early_stop']}"
        for r in rows
        if isinstance(r.get("early_stop"), str) and r["early_stop"]
    ]


def gate_moves(rows: Sequence[Row]) -> list[str]:
    """One line per listed trial a constraint made move a solved gate off its value as found
    (the others keep it: nothing else moves a gate that does not change the objective)."""
    return [
        f"#{int(r['number'])} gates moved by a constraint: {r['gates_moved']}"
        for r in rows
        if isinstance(r.get("gates_moved"), str) and r["gates_moved"]
    ]


# ---------------------------------------------------------------- parameters


def params_tables(
    console: Console, row_keys: Sequence[str], rows: Sequence[Row], base: Row | None
) -> list[tuple[Table, int]]:
    """The parameters of ``base`` and ``rows`` as (table, width to print it at): as many
    tables as it takes to fit the console with every key whole; the keys in the order of
    ``row_keys`` (every row's columns, tuner.ops.trial_rows.TrialRows)."""
    columns = ([base] if base is not None else []) + [r for r in rows if base is None or r["number"] != base["number"]]
    keys = [c for c in row_keys if c.startswith(PARAM_PREFIX) and any(_present(r.get(c)) for r in columns)]
    if not keys or not columns:
        return []
    names = [c.removeprefix(PARAM_PREFIX) for c in keys]
    cells = {
        int(r["number"]): [
            _param_cell(
                r.get(k),
                base.get(k) if base is not None and r is not base else None,
                marked=base is not None and r is not base,
            )
            for k in keys
        ]
        for r in columns
    }
    headers = {int(r["number"]): f"#{int(r['number'])}" + (f"\n{BASE_MARK}" if r is base else "") for r in columns}
    widths = {
        n: max(max(cell_len(line) for line in headers[n].split("\n")), *(cell_len(c.plain) for c in cells[n]))
        for n in cells
    }
    key_width = max(cell_len("config key"), *(cell_len(n) for n in names))
    fixed = [int(base["number"])] if base is not None else []
    others = [n for n in cells if n not in fixed]
    chunks = (
        _chunks(others, widths, 1 + key_width + _BOX_EXTRA + sum(widths[n] + _BOX_EXTRA for n in fixed), console.width)
        if others
        else [[]]
    )
    out = []
    for i, chunk in enumerate(chunks):
        title = "config values" + (f" ({i + 1}/{len(chunks)})" if len(chunks) > 1 else "")
        t = Table(title=title, title_justify="left")
        t.add_column("config key", no_wrap=True, min_width=key_width)
        for n in fixed + chunk:
            t.add_column(headers[n], justify="right", overflow="fold", min_width=widths[n])
        for j, name in enumerate(names):
            t.add_row(Text(name), *(cells[n][j] for n in fixed + chunk))
        needed = 1 + key_width + _BOX_EXTRA + sum(widths[n] + _BOX_EXTRA for n in fixed + chunk)
        out.append((t, max(console.width, needed)))
    return out


def _chunks(numbers_: list[int], widths: dict[int, int], used: int, width: int) -> list[list[int]]:
    """Greedy: as many trial columns per table as fit in ``width`` (at least one)."""
    chunks: list[list[int]] = [[]]
    total = used
    for n in numbers_:
        w = widths[n] + _BOX_EXTRA
        if chunks[-1] and total + w > width:
            chunks.append([])
            total = used
        chunks[-1].append(n)
        total += w
    return chunks


def _param_cell(value: Any, base_value: Any, *, marked: bool) -> Text:
    text = _cell(value)
    if marked and not _same(value, base_value):
        return Text(text + CHANGED, style="bold yellow")
    return Text(text)


def _same(a: Any, b: Any) -> bool:
    if not _present(a) or not _present(b):
        return not _present(a) and not _present(b)
    if _is_num(a) and _is_num(b):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


# ---------------------------------------------------------------- cells


def _cell(value: Any) -> str:
    """A config value: ``0.38``, ``60``, ``[30, 90]`` (tuner.numbers.value)."""
    return config_value(value) if _present(value) else "-"


def _num(value: Any) -> str:
    return num(float(value)) if _is_num(value) else "-"


def _delta(value: Any, base: Any) -> Text:
    if not (_is_num(value) and _is_num(base)):
        return Text("-")
    d = float(value) - float(base)
    return Text(delta(d), style="green" if d > 0 else "red" if d < 0 else "")


def _variant(row: Row) -> str:
    variant = row.get("variant")
    text = variant if isinstance(variant, str) else ""
    if bool(row.get("cache_hit")) is True:
        text = f"{text} (cached)".strip()
    if isinstance(row.get("early_stop"), str) and row["early_stop"]:
        text = f"{text} (stopped early)".strip()
    return text


def _present(value: Any) -> bool:
    if value is None:
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _is_num(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(float(value))


def _u(console: Console, text: str) -> str:
    """``text`` as the console can print it."""
    return text.translate(_ASCII) if console.options.ascii_only else text
