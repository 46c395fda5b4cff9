"""Order the suite's xdist units longest first, from a previous run's measured durations.

``./dev test`` runs ``--dist loadscope --no-loadscope-reorder``: each unit (a module, or
a class in one) goes whole to one worker, in collection order. Handing out the longest
units first (longest-processing-time first) ends the run with short units filling the
gaps, instead of one long fault module running alone after everything else. (xdist's
own reorder, on by default, sorts units by their number of tests: the fault modules,
a few long scenarios each, came last.)

The estimates live in ``module_durations.json`` next to this file: seconds per unit
(setup + call + teardown summed), written by a full run with
``./dev test --save-module-durations``. A unit it does not name (a new module, or every
unit while the file is absent) is estimated from its tests: ``UNKNOWN_LONG_S`` when one
is marked slow or integration, else ``UNKNOWN_PER_TEST_S`` a test. Stale figures only
cost balance, never a test.

``--module-durations=N`` prints the N longest units of this run, with the CPU seconds
each cost (its tests' process and the subprocesses they waited for: tests/conftest.py),
and each worker's busy time (the table the closing notes quote).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DURATIONS_FILE = Path(__file__).with_name("module_durations.json")
UNKNOWN_LONG_S = 30.0
UNKNOWN_PER_TEST_S = 0.5


def unit_of(nodeid: str) -> str:
    """The unit --dist loadscope hands to one worker: the test's module (or class); the
    rule of xdist's LoadScopeScheduling._split_scope."""
    return nodeid.rsplit("::", 1)[0]


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def estimates(units: Mapping[str, Iterable[Any]], known: Mapping[str, float]) -> dict[str, float]:
    """Seconds per unit: the measured figure, else a guess from its tests' marks."""
    out: dict[str, float] = {}
    for unit, items in units.items():
        if unit in known:
            out[unit] = known[unit]
            continue
        items = list(items)
        long = any(i.get_closest_marker("slow") or i.get_closest_marker("integration") for i in items)
        out[unit] = UNKNOWN_LONG_S if long else UNKNOWN_PER_TEST_S * len(items)
    return out


def order_longest_first(items: list[Any], known: Mapping[str, float]) -> None:
    """Sort ``items`` in place: units by estimated duration, longest first; a unit's tests
    keep their order (module fixtures and in-module sequences rely on it)."""
    units: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        units[unit_of(item.nodeid)].append(item)
    guess = estimates(units, known)
    first_seen = {unit: n for n, unit in enumerate(units)}
    items.sort(key=lambda i: (-guess[unit_of(i.nodeid)], first_seen[unit_of(i.nodeid)]))


class DurationReport:
    """A pytest plugin (registered on the controller, or the only process): seconds per
    unit and per worker from every test report; the table and the saved file at the end."""

    def __init__(self, *, top: int = 0, save: bool = False) -> None:
        self.top, self.save_to = top, DURATIONS_FILE if save else None
        self.units: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.workers: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.add(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.units:
            return
        if self.top:
            terminalreporter.write_sep("=", f"{self.top} longest xdist units (seconds summed over their tests)")
            for line in self.table(self.top):
                terminalreporter.write_line(line)
        if self.save_to is not None:
            self.save(self.save_to)
            terminalreporter.write_line(f"unit durations saved to {self.save_to}")

    def add(self, report: Any) -> None:
        self.units[unit_of(report.nodeid)] += report.duration
        self.cpu[unit_of(report.nodeid)] += sum(
            float(v) for k, v in getattr(report, "user_properties", ()) if k == "cpu_s")
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
        self.workers[worker] += report.duration

    def table(self, top: int) -> list[str]:
        ranked = sorted(self.units.items(), key=lambda kv: -kv[1])
        total, cpu = sum(self.units.values()), sum(self.cpu.values())
        lines = [f"{'seconds':>8}  {'share':>5}  {'CPU s':>7}  unit"]
        lines += [f"{s:8.1f}  {100 * s / total if total else 0:4.1f}%  {self.cpu[u]:7.1f}  {u}" for u, s in ranked[:top]]
        lines.append(f"{total:8.1f}  100.0%  {cpu:7.1f}  all {len(ranked)} units")
        busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(self.workers.items()))
        lines.append(f"busy time per worker: {busy}")
        return lines

    def save(self, path: Path = DURATIONS_FILE) -> None:
        """This run's units replace their old figures; units it did not run keep theirs."""
        merged = {**load_durations(path), **{u: round(s, 1) for u, s in self.units.items()}}
        ranked = dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))
        path.write_text(json.dumps(ranked, indent=1) + "\n", encoding="utf-8")
