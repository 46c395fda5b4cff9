"""Bookkeeping off a trial's critical path: the `Bookkeeper` worker thread that runs it
in order, and `OptunaArtifacts`, the dashboard artifacts whose bytes arrive after ``tell``."""

from __future__ import annotations

import mimetypes
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import optuna

from tuner.files import hard_link
from tuner.optuna_adapter import artifact_attr, set_trial_system_attr

#: trials whose bookkeeping may be queued, unfinished, before the study waits for it
MAX_BEHIND = 4
#: the longest a trial waits for room; a job stuck longer (an MLflow server that stopped
#: answering: its client retries a request for minutes) is not waited for again
MAX_WAIT_S = 30.0


class Bookkeeper:
    """Runs queued bookkeeping in order on one worker thread (or inline when
    ``threaded`` is false). Errors never fail a trial that already completed; they
    are collected (``errors``) and passed to ``on_error``.

    The queue is bounded: ``wait_for_room`` blocks while ``max_behind`` jobs are queued
    and unfinished. Trials that come faster than their reports can be written (a
    reloading backend on a busy machine) then wait for the bookkeeping instead of
    piling up behind it: memory stays at a few trials' batches, not a night's, and the
    final flush stays short. A job that keeps the queue full for ``max_wait_s`` (a
    tracking store that stopped answering) is not waited for: the study goes on, the
    queue grows behind it as it did before the bound, and ``on_error`` says so once per
    stuck job. Waiting resumes once that job is done."""

    def __init__(
        self,
        *,
        threaded: bool = True,
        on_error: Callable[[str], None] = lambda message: None,
        max_behind: int = MAX_BEHIND,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-bookkeeper") if threaded else None
        # short jobs a trial waits for before ``tell`` (its MLflow run id): never queued
        # behind earlier trials' reports
        self._eager = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-bookkeeper-eager") if threaded else None
        )
        self._pending: list[Future[Any]] = []
        self._queued: list[Future[Any]] = []  # the main lane's, unfinished as last seen
        self.max_behind = max(1, max_behind)
        self.max_wait_s = max_wait_s
        self._stuck: Future[Any] | None = None  # the job the study gave up waiting for
        self.on_error = on_error
        self.errors: list[str] = []

    def submit(self, what: str, fn: Callable[..., Any], *args: Any, eager: bool = False) -> Future[Any]:
        """Queue ``fn(*args)``; ``eager`` runs it on its own lane, not after the queue."""

        def guarded() -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - reported, never raised into the study
                message = f"{what}: {type(exc).__name__}: {exc}".splitlines()[0]
                self.errors.append(message)
                self.on_error(message)
                return None

        if self._pool is None:
            done: Future[Any] = Future()
            done.set_result(guarded())
            return done
        pool = self._eager if eager and self._eager is not None else self._pool
        future = pool.submit(guarded)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        if pool is self._pool:
            self._queued = [f for f in self._queued if not f.done()] + [future]
        return future

    def wait_for_room(self) -> float:
        """Block until fewer than ``max_behind`` queued jobs are unfinished, at most
        ``max_wait_s`` (see the class doc); the seconds waited (0.0 when there was room or
        the oldest job is one given up on, and always when not threaded)."""
        started, waited = time.perf_counter(), False
        while True:
            self._queued = [f for f in self._queued if not f.done()]
            if len(self._queued) < self.max_behind or self._queued[0] is self._stuck:
                return time.perf_counter() - started if waited else 0.0
            left = self.max_wait_s - (time.perf_counter() - started)
            if left <= 0:
                self._stuck = self._queued[0]
                self.on_error(
                    f"bookkeeping is {len(self._queued)} trials behind and its oldest job has not finished "
                    f"in {self.max_wait_s:g} s (an MLflow store that stopped answering?); the study goes on "
                    "without waiting for it"
                )
                return time.perf_counter() - started
            wait(self._queued[:1], timeout=left, return_when=FIRST_COMPLETED)
            waited = True

    def flush(self) -> None:
        """Wait until everything queued so far is done."""
        for future in list(self._pending):
            future.result()
        self._pending = []

    def close(self) -> None:
        self.flush()
        for pool in (self._eager, self._pool):
            if pool is not None:
                pool.shutdown(wait=True)


class OptunaArtifacts:
    """Optuna artifacts (optuna-dashboard --artifact-dir DIR) whose bytes arrive late.

    ``register`` records an artifact on the running trial exactly as
    ``optuna.artifacts.upload_artifact`` does (a ``artifacts:<id>`` system attribute
    holding its ArtifactMeta); ``write`` stores its bytes later, from the bookkeeper,
    when the trial is already finished (upload_artifact cannot do that: a finished
    trial's attributes are frozen).
    """

    def __init__(self, store_dir: Path) -> None:
        from optuna.artifacts import FileSystemArtifactStore

        store_dir.mkdir(parents=True, exist_ok=True)
        self.store_dir = store_dir
        self.store = FileSystemArtifactStore(str(store_dir))

    def register(self, trial: optuna.Trial, filename: str) -> str:
        artifact_id, key, value = self.listing(filename)
        set_trial_system_attr(trial, key, value)
        return artifact_id

    def listing(self, filename: str) -> tuple[str, str, str]:
        """A new artifact id for ``filename`` and the system attribute (key, value) that
        lists it on a trial (``register`` sets it; a trial's record sets it with the rest)."""
        mimetype, encoding = mimetypes.guess_type(filename)
        if Path(filename).suffix in {".yaml", ".yml", ".md", ".json"}:
            mimetype = "text/plain"  # shown inline by the dashboard
        artifact_id = str(uuid.uuid4())
        return (artifact_id, *artifact_attr(artifact_id, filename, mimetype or "application/octet-stream", encoding))

    def write(self, artifact_id: str, path: Path) -> None:
        """Store ``path`` under ``artifact_id``: a hard link to the trial's own file (one
        copy on disk; FileSystemArtifactStore keeps an artifact at ``<dir>/<id>``), a copy
        only where a link cannot be made (another filesystem)."""
        if hard_link(path, self.store_dir / artifact_id):
            return
        with open(path, "rb") as fh:
            self.store.write(artifact_id, fh)
