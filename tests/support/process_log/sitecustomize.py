"""Count the Python processes a test run starts, and their CPU (opt-in, for measuring the suite).

    TUNER_TEST_PROCESS_LOG=/tmp/plog PYTHONPATH=$PWD/tests/support/process_log ./dev test ...
    python tests/support/process_log/summary.py /tmp/plog

Python imports ``sitecustomize`` at start-up from its path, so with this folder on
PYTHONPATH (an absolute path: tests run commands in their own folders; inherited by every xdist worker, `tuner` subprocess, reference backend and
helper) each process writes a line when it starts and one when it exits normally: its
CPU seconds (its own and its waited-for children's), wall seconds and command line. A
process killed by a signal writes only its start line: it is counted, its CPU is not.
Without the variable this module does nothing.
"""

from __future__ import annotations

import os

_FOLDER = os.environ.get("TUNER_TEST_PROCESS_LOG")

if _FOLDER:
    import atexit
    import sys
    import time

    _STARTED = time.monotonic()

    def _write(event: str) -> None:
        t = os.times()
        argv = " ".join(sys.argv).replace("\t", " ").replace("\n", " ")[:400]
        line = f"{event}\t{os.getpid()}\t{t.user + t.system:.3f}\t{t.children_user + t.children_system:.3f}\t"
        line += f"{time.monotonic() - _STARTED:.3f}\t{argv}\n"
        try:
            with open(os.path.join(_FOLDER, f"{os.getpid()}.tsv"), "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            pass  # a measurement aid never fails the process

    _write("start")  # sys.argv is not set yet for `-m`: the exit line names the command
    atexit.register(_write, "exit")
