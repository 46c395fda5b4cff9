"""Write a study's trial reports in a separate process.

A trial's report files (the JSON scorecard, Markdown, per-query CSV and the PR-curve
PNG) cost ~0.2-0.3 s of CPU, mostly Python (building the report, matplotlib's text
layout). In a pipelined study they are written while the next trial's search calls
run; in the tuner's process that work would share the GIL with the event loop reading
the answers and slow the search down. A `ReportWorker` hands it to one helper process
(``python -m tuner.report.report_worker``, started on first use, at a lower CPU
priority than the backend and the tuner): the bookkeeping thread sends the batch
(pickled) and waits for the paths without holding the GIL.

    worker = ReportWorker()
    paths = worker.write_reports(result, out_dir, context=ctx, ...)   # tuner.report.write_reports
    worker.close()

The helper runs ``tuner.report.write_reports`` itself, so the files are the same. It
scrubs the same secrets: every request carries the values this process knows as
secret (tuner.secrets), which the helper remembers before it writes. It is a plain
child process speaking length-prefixed pickles over its stdin and stdout (not
multiprocessing, which would import the caller's ``__main__`` again) and exits when
its stdin closes, so it never outlives the tuner. When it cannot be started or dies,
the call runs in process and ``fallback`` says why (a missing report is never the cost
of a dead helper); an error of the writing itself is raised to the caller as it is.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

from tuner.held import HELD as _HELD

#: the helper's niceness increment: the backend and the tuner's event loop come first
NICE = 10
_HEADER = struct.Struct("!Q")


class ReportWorker:
    """One helper process writing report files (see the module docstring)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self.fallback: str | None = None  # why writing went back in process, once it did
        self._held: dict[str, Any] = {}  # the study-wide parts of a batch the helper holds (see write_reports)

    def write_reports(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        """``tuner.report.write_reports(result, *args, **kwargs)``, in the helper. The batch
        is sent cut to what reports read (tuner.report.build.for_reports: the same files,
        a third of the pickle), and without its labels and queries when they equal the
        ones the helper was last sent (it keeps them): they are the same every trial of a
        study, about 40 % of what was left."""
        from tuner.report.build import for_reports
        from tuner.report.writer import write_reports

        cut = for_reports(result)
        with self._lock:  # re-entered by _call: what the helper holds changes only in call order
            self._ensure()  # a helper started now holds nothing yet
            shared = {
                name: _HELD if _same(self._held.get(name, _HELD), value) else value
                for name, value in (("qrels", cut.qrels), ("queries", cut.queries))
            }
            self._held = {"qrels": cut.qrels, "queries": cut.queries}
            gone: Any = None  # the helper fills both in from ``shared``
            sent = replace(cut, qrels=gone, queries=gone)
            return self._call(
                "write_reports", write_reports, (sent, *args), kwargs, shared=shared, local_args=(cut, *args)
            )

    def render(self, sweep: Any, *, title: str, threshold: float | None) -> bytes:
        """``tuner.report.plots.pr_curve_png``, in the helper."""
        from tuner.report.plots import pr_curve_png

        return self._call("pr_curve_png", pr_curve_png, (sweep,), {"title": title, "threshold": threshold})

    def start(self) -> None:
        """Start the helper now rather than on first use: it imports the report modules
        and matplotlib (~1-2 s of CPU) while the caller waits for its backend to come up,
        not beside the first trial's search calls."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        """End the helper; later calls run in process."""
        with self._lock:
            self._stop(self.fallback or "closed: writing in process")

    def _call(
        self,
        name: str,
        local: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        shared: dict[str, Any] | None = None,
        local_args: tuple[Any, ...] | None = None,
    ) -> Any:
        """``local(*args, **kwargs)`` in the helper (``shared``: the batch's fields it fills
        in, `_HELD` for the ones it keeps from the last call); in process when there is no
        helper (with ``local_args``, the whole batch, where given)."""
        from tuner.secrets import known_values

        with self._lock:
            proc = self._ensure()
            if proc is not None:
                try:
                    _send(proc.stdin, (name, args, kwargs, known_values(), shared))
                    ok, payload = _receive(proc.stdout)
                except (OSError, EOFError, pickle.PickleError, struct.error) as exc:
                    self._stop(f"the report helper died ({type(exc).__name__}); writing in process")
                else:
                    if ok:
                        return payload
                    raise payload  # the writing itself failed: the error it raised
        return local(*(local_args if local_args is not None else args), **kwargs)

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        if self._proc is None and self.fallback is None:
            try:
                self._held = {}  # a new helper holds nothing yet
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tuner.report.report_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
            except OSError as exc:
                self.fallback = f"no report helper ({exc.strerror or exc}); writing in process"
        return self._proc

    def _stop(self, why: str) -> None:
        proc, self._proc = self._proc, None
        self.fallback = why
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the helper's loop ends on EOF
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def _same(held: Any, value: Any) -> bool:
    """Whether the helper's copy ``held`` equals ``value`` (by content: a batch's labels
    are a fresh dict each trial)."""
    if held is _HELD:
        return False
    return held is value or bool(held == value)


def _send(stream: IO[bytes] | None, value: Any) -> None:
    assert stream is not None
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes] | None) -> Any:
    assert stream is not None
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the report helper closed its output")
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the report helper's answer was cut short")
    return pickle.loads(data)


def _serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The helper's loop: one request, one answer ((True, value) or (False, exception))."""
    # the drawing modules pr_curve_png imports on first use, imported before the first request
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401
    from PIL import Image  # noqa: F401

    from tuner.report.plots import pr_curve_png
    from tuner.report.writer import write_reports
    from tuner.secrets import remember

    calls: dict[str, Callable[..., Any]] = {"write_reports": write_reports, "pr_curve_png": pr_curve_png}
    held: dict[str, Any] = {}
    while True:
        try:
            name, args, kwargs, secrets, shared = _receive(inp)
        except EOFError:
            return
        remember(*secrets)
        try:
            if shared is not None:  # the batch's study-wide fields: sent, or the ones held from the last call
                held.update({k: v for k, v in shared.items() if v is not _HELD})
                args = (replace(args[0], **{k: held[k] for k in shared}), *args[1:])
            answer: tuple[bool, Any] = (True, calls[name](*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - sent back to the caller, which raises it
            try:
                pickle.dumps(exc)
            except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
                exc = RuntimeError(f"{type(exc).__name__}: {exc}".splitlines()[0])
            answer = (False, exc)
        _send(out, answer)


if __name__ == "__main__":
    from tuner.threads import limit_blas_threads

    try:
        os.nice(NICE)
    except OSError:
        pass
    limit_blas_threads()
    _serve(sys.stdin.buffer, sys.stdout.buffer)
    # Every answer is sent and every file written and closed: leave without the
    # interpreter's teardown of matplotlib and pandas, which the caller's close() waits
    # for (0.3-0.7 s, and seconds at this niceness on a busy machine, at every run's end).
    os._exit(0)
