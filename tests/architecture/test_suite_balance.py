"""The suite's xdist balance (support/balance.py): units handed out longest first by the
measured durations, a unit's tests kept together and in order, unknown units guessed
from their marks; the saved figures merge with the old ones; ./dev keeps the order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.balance import UNKNOWN_LONG_S, DurationReport, load_durations, order_longest_first, unit_of

REPO = Path(__file__).resolve().parents[2]


@dataclass
class FakeItem:
    nodeid: str
    marks: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks else None


@dataclass
class FakeReport:
    nodeid: str
    duration: float
    node: Any = field(default=None)
    user_properties: list[tuple[str, Any]] = field(default_factory=list)


def ids(items: list[FakeItem]) -> list[str]:
    return [i.nodeid for i in items]


def test_unit_is_the_module_or_the_class_as_loadscope_splits_it() -> None:
    assert unit_of("tests/a/test_x.py::test_one[p-1]") == "tests/a/test_x.py"
    assert unit_of("tests/a/test_x.py::TestC::test_two") == "tests/a/test_x.py::TestC"


def test_longest_units_first_and_each_units_tests_together_in_order() -> None:
    items = [FakeItem("s.py::t1"), FakeItem("long.py::t1"), FakeItem("s.py::t2"), FakeItem("mid.py::t1"),
             FakeItem("long.py::t2")]
    order_longest_first(items, {"s.py": 1.0, "long.py": 300.0, "mid.py": 40.0})
    assert ids(items) == ["long.py::t1", "long.py::t2", "mid.py::t1", "s.py::t1", "s.py::t2"]


def test_an_unmeasured_unit_is_guessed_from_its_marks() -> None:
    items = [FakeItem("tiny.py::t1"), FakeItem("new_fast.py::t1"), FakeItem("new_slow.py::t1", ("slow",)),
             FakeItem("new_pg.py::t1", ("integration",)), FakeItem("known.py::t1")]
    order_longest_first(items, {"known.py": UNKNOWN_LONG_S + 1, "tiny.py": 0.1})
    # unknown slow / integration units rank as UNKNOWN_LONG_S, unknown others by their
    # tests (0.5 s each); equal estimates keep their collection order.
    assert ids(items) == ["known.py::t1", "new_slow.py::t1", "new_pg.py::t1", "new_fast.py::t1", "tiny.py::t1"]


def test_the_report_sums_units_and_workers_and_saving_merges(tmp_path: Path) -> None:
    worker = type("Node", (), {"gateway": type("Gw", (), {"id": "gw1"})()})()
    report = DurationReport(top=2)
    for nodeid, seconds, cpu in [("a.py::t1", 2.0, 1.5), ("a.py::t2", 3.0, 0.25), ("b.py::C::t", 1.0, 0.0)]:
        report.add(FakeReport(nodeid, seconds, worker, [("other", 9), ("cpu_s", cpu)]))
    report.add(FakeReport("c.py::t", 0.4))  # no CPU figure: counts 0
    lines = report.table(2)
    assert lines[1].split() == ["5.0", "78.1%", "1.8", "a.py"] and lines[2].split()[-1] == "b.py::C"
    assert lines[-2].split()[:3] == ["6.4", "100.0%", "1.8"] and lines[-1] == "busy time per worker: gw1 6 s, main 0 s"
    saved = tmp_path / "durations.json"
    saved.write_text(json.dumps({"a.py": 99.0, "old.py": 7.0}))
    report.save(saved)
    assert load_durations(saved) == {"a.py": 5.0, "old.py": 7.0, "b.py::C": 1.0, "c.py": 0.4}
    assert list(load_durations(saved)) == ["old.py", "a.py", "b.py::C", "c.py"]  # longest first


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]"])
def test_a_missing_or_broken_durations_file_only_loses_the_order(tmp_path: Path, text: str) -> None:
    path = tmp_path / "durations.json"
    if text:
        path.write_text(text)
    assert load_durations(path) == {}


def test_dev_keeps_the_suites_order_for_xdist() -> None:
    # xdist's default reorder sorts units by their number of tests, which undoes the
    # longest-first order (the few-but-long fault modules came last).
    dev = (REPO / "dev").read_text()
    assert '--dist loadscope --no-loadscope-reorder"' in dev
