"""`tuner optuna-dashboard STORAGE` (the process `tuner dashboard` starts) as a test runs
it: on a free port, until the block ends; no browser here (tests/browser/browser_support
has Chromium)::

    with optuna_dashboard(storage_url) as base:     # http://127.0.0.1:PORT/dashboard/
        httpx.get(base.replace("/dashboard/", "/api/studies"))
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

DEADLINE_S = 120  # generous: the first start on a loaded machine imports a lot


@contextlib.contextmanager
def optuna_dashboard(storage: str, *, artifact_dir: Path | None = None) -> Iterator[str]:
    """Started, and answering ``/api/studies``; yields its page's URL
    (``http://127.0.0.1:PORT/dashboard/``). Then SIGINT: not ended in 60 s, it is killed and
    the test fails."""
    import httpx

    from tuner.config.experiment import free_port

    port = free_port()
    extra = ["--artifact-dir", str(artifact_dir)] if artifact_dir is not None else []
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "optuna-dashboard", storage, *extra, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        end = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, f"tuner optuna-dashboard ended: {proc.communicate()[1]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < end, f"tuner optuna-dashboard did not answer within {DEADLINE_S} s"
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/dashboard/"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            # killed quietly, this hid a `tuner optuna-dashboard` that ignored SIGINT (60 s a
            # test); raised without `from`, so a failure of the body stays its context
            raise AssertionError("tuner optuna-dashboard did not stop within 60 s of SIGINT")  # noqa: B904
