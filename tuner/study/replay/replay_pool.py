"""Scoring replayed fusion settings, in this process and in helper processes.

A fusion search scores hundreds of settings from one explained retrieval, a few
milliseconds of CPU each (replay the batch, solve the gates), while the backend sits
idle. ``ReplayContext`` holds everything a setting's score depends on (the
explanations, the labels, the gates, the objective and the constraints) and scores
settings with it (``score``); it pickles, so ``ReplayPool`` sends it once per trial to
``workers`` helper processes and splits a grid between them and this process. The
results come back in grid order, the same numbers either way (each is computed by the
same code on the same values).

A trial whose context has the same content as the last one sent (its sampled params left
the candidates as they were, e.g. a recency or top_m param, and the labels and gates are
the study's) is not sent again: the helpers are told to keep the one they hold
(``_SAME``), flattened batch and all, and this process reuses its own flattened batch
(``ReplayBatch``): the pickling, unpickling and flattening of the batch are paid once per
distinct context, not once per trial. Contents are compared as their pickled bytes, so a
changed label, gate or explanation is always sent.

The helpers are plain child processes (``python -m tuner.study.replay.replay_pool``) speaking
length-prefixed pickles over stdin/stdout, as the report helper does
(tuner.report.report_worker); they exit when their stdin closes. A helper that cannot
be started or dies leaves its share to this process, and ``fallback`` says why.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.held import HELD as _SAME
from tuner.report.report_worker import _receive, _send

if TYPE_CHECKING:
    from tuner.evaluation.replay_batch import ReplayBatch

#: (objective, largest violation, tabulated columns) of one scored setting
Score = tuple[float, float, dict[str, float]]


#: ReplayContext's fields that ``content`` holds, in the order of its constructor
_CONTENT = ("explained", "query_ids", "is_oos", "qrels", "top_k", "gains", "gates", "objective", "constraints")


class _CanonicalPickler(pickle.Pickler):
    """The same bytes for equal values: without the memo (``fast``: an object met twice is
    written twice, so which objects happen to be shared changes nothing; the fields it
    pickles hold no cycles), and a pydantic model (a constraint) with its set of fields
    set in sorted order (a set's pickle follows its iteration order, which for equal sets
    of strings depends on the order they were added and on the hash seed: the same
    constraint pickled, loaded and pickled again gave other bytes under 7 of 40 seeds)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fast = True

    def reducer_override(self, obj: Any) -> Any:
        from pydantic import BaseModel

        if isinstance(obj, BaseModel):
            return _model, (type(obj), dict(obj.__dict__), tuple(sorted(obj.model_fields_set)))
        return NotImplemented


def _model(cls: Any, values: dict[str, Any], fields_set: tuple[str, ...]) -> Any:
    return cls.model_construct(_fields_set=set(fields_set), **values)


def _canonical_dumps(value: Any) -> bytes:
    """``value`` pickled, the same bytes for equal values whatever the hash seed (_CanonicalPickler)."""
    buffer = io.BytesIO()
    _CanonicalPickler(buffer).dump(value)
    return buffer.getvalue()


@dataclass
class ReplayContext:
    """What scoring a fusion setting needs (picklable; the flattened batch is built on
    first use, in whichever process scores)."""

    explained: Mapping[str, Any]  # query id -> tuner.evaluation.fusion_replay.Explained
    query_ids: tuple[str, ...]
    is_oos: tuple[bool, ...]
    qrels: Mapping[str, Mapping[str, int]]
    top_k: int
    gains: str
    gates: Mapping[str, Any]  # param name -> tuner.study.gates.threshold.GateRange, solved per setting
    objective: str
    constraints: Sequence[Any]
    #: names this context to the helpers (an ``id()`` may be reused by the next trial's)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _flat: ReplayBatch | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_flat": None}  # rebuilt where it is used

    def content(self) -> bytes:
        """What a setting's score depends on, pickled (not the token nor the flattened
        batch): two contexts with the same bytes score every setting the same. Each field
        and each query's explanation is pickled on its own, the explanations by query id, so
        neither the order the answers came in (shuffled per trial) nor objects one trial's
        answers happen to share change the bytes."""
        explained = [(q, pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)) for q, e in sorted(self.explained.items())]
        fields = [explained, *(getattr(self, name) for name in _CONTENT[1:])]
        return pickle.dumps([_canonical_dumps(v) for v in fields])

    @classmethod
    def from_content(cls, data: bytes) -> ReplayContext:
        """The context ``content`` pickled (a new token, its batch flattened on first use)."""
        explained, *rest = (pickle.loads(part) for part in pickle.loads(data))
        return cls({q: pickle.loads(e) for q, e in explained}, *rest)

    def share_batch(self, other: ReplayContext) -> None:
        """Take ``other``'s flattened batch if it has one: only for a context with the same
        ``content`` (the batch is a function of it)."""
        if self._flat is None:
            self._flat = other._flat

    def score(self, settings: Sequence[Any]) -> list[Score]:
        """The score of each FusionSetting of ``settings``, in order."""
        return [self.solved(self._arrays(setting)) for setting in settings]

    def bound(self, settings: Sequence[Any]) -> list[Any]:
        """For each FusionSetting of ``settings``, in order, a tuner.study.gates.threshold.GateBound
        of its score (None: no bound holds), a fraction of ``score``'s cost: the settings
        replayed and bounded a chunk at a time (ReplayBatch.stacked,
        tuner.study.gates.threshold.bound_stacked), the same bounds as ``bound_each``'s."""
        import numpy as np

        from tuner.study.gates.threshold import MIN_SCORE, bound_stacked

        gates = list(self.gates.values())
        low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
        is_oos = np.asarray(self.is_oos, dtype=bool)
        flat = self._batch()
        out: list[Any] = [None] * len(settings)
        for where, stack in flat.stacked(settings):
            bounds = bound_stacked(
                stack,
                is_oos,
                flat.failed,
                flat.label_counts,
                self.gains,
                gates,
                objective=self.objective,
                constraints=self.constraints,
                retrieved_min_score=low,
            )
            if bounds is None:
                bounds = self.bound_each([settings[i] for i in where])
            for i, b in zip(where, bounds, strict=True):
                out[i] = b
        return out

    def bound_each(self, settings: Sequence[Any]) -> list[Any]:
        """``bound``, each setting replayed and bounded on its own (tuner.study.gates.threshold.bound_arrays):
        where the stacked bound does not apply, and its oracle in the tests."""
        from tuner.study.gates.threshold import MIN_SCORE, bound_arrays

        gates = list(self.gates.values())
        low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
        return [
            bound_arrays(
                self._arrays(setting),
                gates,
                objective=self.objective,
                constraints=self.constraints,
                retrieved_min_score=low,
            )
            for setting in settings
        ]

    def per_query(self, items: Sequence[tuple[Any, Mapping[str, float]]]) -> list[tuple[list[float], str]]:
        """For each (FusionSetting, its solved gate values by param name): the objective per
        in-scope query and the OOS queries answered ("1"/"0" each), at those gates
        (tuner.study.gates.gate_arrays.per_query_at): a scored setting's per-query record."""
        from tuner.study.gates.gate_arrays import per_query_at
        from tuner.study.gates.threshold import CONFIDENCE, MIN_SCORE

        out = []
        backend_handoff = not any(g.role == CONFIDENCE for g in self.gates.values())
        for setting, solved in items:
            at = {g.role: float(solved[name]) for name, g in self.gates.items() if name in solved}
            scores, answered = per_query_at(
                self._arrays(setting),
                at.get(CONFIDENCE, -math.inf),
                at.get(MIN_SCORE, -math.inf),
                self.objective,
                backend_handoff=backend_handoff,
            )
            out.append((scores.tolist(), "".join("1" if a else "0" for a in answered)))
        return out

    def _arrays(self, setting: Any) -> Any:
        import numpy as np

        from tuner.study.gates.gate_arrays import HitArrays

        is_oos = np.asarray(self.is_oos, dtype=bool)
        r = self._batch().table(setting)
        return HitArrays(self.query_ids, is_oos, r.failed, r.handoff, r.confidence, r.table, self.gains)

    def _batch(self) -> ReplayBatch:
        import numpy as np

        from tuner.evaluation.replay_batch import ReplayBatch

        if self._flat is None:
            is_oos = np.asarray(self.is_oos, dtype=bool)
            self._flat = ReplayBatch(self.explained, self.query_ids, ~is_oos, self.qrels, self.top_k)
        return self._flat

    def solved(self, arrays: Any) -> Score:
        """The objective and largest violation of a retrieval (tuner.study.gates.gate_arrays.HitArrays)
        at its solved gates, and the columns a sweep table shows: the one solver for replayed
        and live retrievals, so both give the same numbers for the same answers."""
        from tuner.study.gates.threshold import MIN_SCORE, solve_arrays

        gates = list(self.gates.values())
        low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
        sol = solve_arrays(
            arrays, gates, objective=self.objective, constraints=self.constraints, retrieved_min_score=low, full=False
        )
        columns = {
            c.metric: float(sol.metrics[c.metric])
            for c in self.constraints
            if getattr(c, "metric", None) in sol.metrics
        }
        columns.update({f"solved.{name}": sol.by_role[g.role] for name, g in self.gates.items()})
        return float(sol.objective), float(sol.violation), columns


class ReplayPool:
    """``workers`` helper processes scoring fusion settings beside this one (module doc)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(0, workers)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._loaded: str | None = None  # token of the context the helpers hold
        #: the content the helpers hold and the last context sent with it (its flattened batch reused here)
        self._held: tuple[bytes, ReplayContext] | None = None
        self.fallback: str | None = None
        #: contexts the helpers were told to keep (the same content as the last one), not sent again
        self.kept = 0

    def start(self) -> None:
        """Start the helpers now (they import numpy and the scorer while the backend starts)."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        with self._lock:
            self._stop("closed")

    def score(self, context: ReplayContext, settings: Sequence[Any]) -> list[Score]:
        """``context.score(settings)``, split between this process and the helpers."""
        return self._run(context, "score", settings)

    def bound(self, context: ReplayContext, settings: Sequence[Any]) -> list[Any]:
        """``context.bound(settings)``, split between this process and the helpers."""
        return self._run(context, "bound", settings)

    def per_query(self, context: ReplayContext, items: Sequence[Any]) -> list[Any]:
        """``context.per_query(items)``, split between this process and the helpers."""
        return self._run(context, "per_query", items)

    def _run(self, context: ReplayContext, method: str, settings: Sequence[Any]) -> list[Any]:
        work = getattr(context, method)
        with self._lock:
            procs = self._ensure() if len(settings) >= 8 else []
            if not procs:
                return work(settings)
            parts = _split(list(settings), len(procs) + 1)
            try:
                if self._loaded != context.token:
                    data = context.content()
                    same = self._held is not None and self._held[0] == data
                    if same:
                        assert self._held is not None
                        context.share_batch(self._held[1])
                    for proc in procs:
                        _send(proc.stdin, ("load", _SAME if same else data))
                    self._loaded, self._held = context.token, (data, context)
                    self.kept += same
                for proc, part in zip(procs, parts[1:], strict=True):
                    _send(proc.stdin, (method, part))
                mine = work(parts[0])
                theirs = []
                for proc in procs:
                    ok, payload = _receive(proc.stdout)
                    if not ok:
                        raise payload
                    theirs.append(payload)
            except (OSError, EOFError, pickle.PickleError, struct.error) as exc:
                self._stop(f"a replay helper died ({type(exc).__name__}); scoring in process")
                return work(settings)
            return [*mine, *(s for chunk in theirs for s in chunk)]

    def _ensure(self) -> list[subprocess.Popen[bytes]]:
        if not self._procs and self.fallback is None and self.workers:
            try:
                self._procs = [
                    subprocess.Popen(
                        [sys.executable, "-m", "tuner.study.replay.replay_pool"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                    )
                    for _ in range(self.workers)
                ]
            except OSError as exc:
                self._stop(f"no replay helper ({exc.strerror or exc}); scoring in process")
        return self._procs

    def _stop(self, why: str) -> None:
        procs, self._procs = self._procs, []
        self.fallback, self._loaded, self._held = why, None, None
        for proc in procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()


def default_workers() -> int:
    """Helpers beside this process: one fewer than the cores this process may use (at most 7)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, 7))


def _split(items: list[Any], n: int) -> list[list[Any]]:
    size, extra = divmod(len(items), n)
    out, at = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(items[at : at + step])
        at += step
    return out


def _serve(inp: Any, out: Any) -> None:
    """A helper's loop: ("load", a context's ``content``) keeps it, ("load", _SAME) keeps the one
    held (with its flattened batch); ("score", "bound" or "per_query", settings) answers (True,
    what that method of the context returns)."""
    from tuner.evaluation.replay_batch import ReplayBatch  # noqa: F401 - imported before the first request
    from tuner.study.gates.threshold import solve_arrays  # noqa: F401

    context: ReplayContext | None = None
    while True:
        try:
            kind, payload = _receive(inp)
        except EOFError:
            return
        if kind == "load":
            if payload is not _SAME:
                context = ReplayContext.from_content(payload)
            continue
        try:
            assert context is not None, f"{kind} before load"
            assert kind in ("score", "bound", "per_query"), f"unknown request {kind!r}"
            answer: tuple[bool, Any] = (True, getattr(context, kind)(payload))
        except Exception as exc:  # noqa: BLE001 - sent back to the caller, which raises it
            answer = (False, RuntimeError(f"{type(exc).__name__}: {exc}".splitlines()[0]))
        _send(out, answer)


if __name__ == "__main__":
    from tuner.threads import limit_blas_threads

    limit_blas_threads()
    _serve(sys.stdin.buffer, sys.stdout.buffer)
