"""The fault suite's summary under pytest-xdist: each worker leaves its records in a
file, the controller (tests/conftest.py) prints one summary of them all, every class of
the suite listed once, in the suite's order."""

from __future__ import annotations

from pathlib import Path

from faults.faultlib import FaultLog, FaultRecord, read_worker_records, write_summary, write_worker_records

CLASSES = ["timeouts", "disk-full", "slow-drip"]


class Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_the_summary_of_a_parallel_run_adds_up_every_workers_records(tmp_path: Path) -> None:
    gw0, gw1 = FaultLog(), FaultLog()
    gw0.add(FaultRecord("timeouts", injected=2, survived=2))
    gw1.add(FaultRecord("timeouts", injected=1, trials_lost=1, problems=["lost: trial 3"]))
    gw1.add(FaultRecord("disk-full", injected=1, survived=1, configs_left_patched=0))
    write_worker_records(tmp_path, "gw0", gw0, CLASSES)
    write_worker_records(tmp_path, "gw1", gw1, CLASSES)

    classes, log = read_worker_records(tmp_path)
    terminal = Terminal()
    write_summary(terminal, log, classes)
    assert terminal.lines == [
        "== fault suite",
        "fault timeouts: injected 3, survived 2, trials lost 1, configs left patched 0, served other than the file 0",
        "fault disk-full: injected 1, survived 1, trials lost 0, configs left patched 0, served other than the file 0",
        "fault slow-drip: not run (skipped or deselected)",
        "fault suite total: trials lost 1, configs left patched 0, served other than the file 0",
    ]
    assert log.by_name()["timeouts"].problems == ["lost: trial 3"]


def test_no_records_print_no_section(tmp_path: Path) -> None:
    terminal = Terminal()
    write_summary(terminal, FaultLog(), CLASSES)
    assert terminal.lines == []
