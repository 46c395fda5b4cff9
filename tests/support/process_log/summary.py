"""Summarise a TUNER_TEST_PROCESS_LOG folder (see sitecustomize.py here): processes per
kind, how many exited normally, their own CPU seconds, total and per process.

    python tests/support/process_log/summary.py /tmp/plog
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

KINDS = (  # (what the command line contains, the kind): first match wins; at exit a
    # `python -m package` names the package's __main__.py, a `-m module` the module's file
    ("fusion_backend/__main__.py serve", "reference backend"),
    ("fusion_backend", "fusion_backend (importer, other)"),
    ("tuner/report/report_worker.py", "tuner report helper"),
    ("tuner/study/replay/replay_pool.py", "tuner replay helper"),
    ("fault_backend.py", "fault backend"),
    ("pytest", "pytest (controller)"),
    ("mlflow", "mlflow server"),
)


def kind_of(argv: str) -> str:
    words = argv.split()
    if words and (words[0].endswith("tuner") or words[0].endswith("tuner/__main__.py")):
        return f"tuner {words[1] if len(words) > 1 else ''}".strip()
    for needle, kind in KINDS:
        if needle in argv:
            return kind
    return "xdist worker, python -c" if argv == "-c" else "other python"


def main(folder: Path) -> None:
    started: set[str] = set()
    exits: dict[str, tuple[float, str]] = {}
    for path in folder.glob("*.tsv"):
        for line in path.read_text(encoding="utf-8").splitlines():
            event, pid, cpu, _children, _wall, argv = (line.split("\t") + [""] * 6)[:6]
            key = f"{path.stem}:{pid}"
            started.add(key)
            if event == "exit":
                exits[key] = (float(cpu), argv)
    count: dict[str, int] = defaultdict(int)
    ended: dict[str, int] = defaultdict(int)
    cpu: dict[str, float] = defaultdict(float)
    for key in started:
        own, argv = exits.get(key, (0.0, ""))
        kind = kind_of(argv) if key in exits else "killed (no exit line)"
        count[kind] += 1
        if key in exits:
            ended[kind] += 1
            cpu[kind] += own
    print(f"{'processes':>9}  {'exited':>6}  {'own CPU s':>9}  {'per process':>11}  kind")
    for kind in sorted(count, key=lambda k: -cpu[k]):
        per = cpu[kind] / ended[kind] if ended[kind] else 0.0
        print(f"{count[kind]:9d}  {ended[kind]:6d}  {cpu[kind]:9.1f}  {per:11.2f}  {kind}")
    print(f"{len(started):9d}  {sum(ended.values()):6d}  {sum(cpu.values()):9.1f}  {'':11}  all")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
