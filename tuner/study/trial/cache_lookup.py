"""A trial's result-cache side: its cache key (config texts, evaluation fingerprints,
declared target.inputs, the backend's data fingerprint), the lookup, and the key a
measured result is stored under.

`CacheLookup` is mixed into `tuner.study.trial.runner.TrialRunner`: it reads the runner's
fields annotated below and its ``_named_texts`` helper, and keeps the backend
fingerprint of the last health answer on the runner.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.objective import Constraint, Objective
from tuner.data.inputs import changed_files, describe_files
from tuner.errors import TargetError
from tuner.study.storage.result_cache import CachedResult, CacheKey, ResultCache, cache_key, short_fingerprint
from tuner.study.trial.interfaces import BatchEvaluator, InputsLike
from tuner.study.trial.outcome import TrialOutcome
from tuner.targets.health import health_fingerprint


class CacheLookup:
    """The cache-key and lookup steps of `TrialRunner` (see the module docstring)."""

    # TrialRunner fields read (and, for backend_fingerprint, written) here
    evaluator: BatchEvaluator
    objective: Objective
    constraints: Sequence[Constraint]
    cache: ResultCache | None
    wait_healthy: Callable[[], Any]
    inputs: InputsLike | None
    backend_fingerprint_field: str | None
    backend_fingerprint: str | None
    touched_backend: bool

    if TYPE_CHECKING:  # TrialRunner's methods used here (declared for the type checker only)

        def _named_texts(self, texts: Mapping[Path, str]) -> dict[str, str]: ...

    def _cache_key(self, texts: Mapping[Path, str], solving: Mapping[str, Any] | None = None) -> CacheKey:
        spec = self.evaluator.spec_fingerprint
        if solving:
            # A solved result also depends on the gate grids, the objective and the constraints.
            # ...and on each gate's value as found, which it keeps when nothing asks it to move.
            spec += json.dumps(
                {
                    "solve": {n: [g.low, g.high, g.step, g.role, g.found] for n, g in sorted(solving.items())},
                    "objective": self.objective.metric,
                    "constraints": [c.name for c in self.constraints],
                },
                sort_keys=True,
            )
        base = cache_key(
            self._named_texts(texts),
            dataset_hash=self.evaluator.dataset_hash,
            labels_fingerprint=self.evaluator.labels_fingerprint,
            eval_spec_json=spec,
        )
        inputs = self.inputs.current() if self.inputs is not None else None
        backend = self._lookup_backend_fingerprint() if self.cache is not None else self.backend_fingerprint
        return CacheKey(base, inputs, backend)

    def _measured_key(self, key: CacheKey, out: TrialOutcome) -> CacheKey | None:
        """The key a measured result is stored under: with the backend fingerprint seen
        after this trial's restart (the data it was measured on), or None (not stored)
        when a declared input changed while the trial ran (which version the backend
        loaded is unknown)."""
        if self.backend_fingerprint_field is not None and self.backend_fingerprint != key.backend:
            if self.cache is not None and key.backend is not None:
                self._note(
                    out,
                    f"backend fingerprint after the restart: {short_fingerprint(self.backend_fingerprint)}"
                    f" (looked up with {short_fingerprint(key.backend)})",
                )
            key = replace(key, backend=self.backend_fingerprint)
            out.backend_fingerprint = key.backend
        if self.inputs is not None and key.inputs is not None:
            now = self.inputs.current()
            if now.digest != key.inputs.digest:
                changed = describe_files(changed_files(key.inputs.files, now.files))
                self._note(
                    out,
                    f"target.inputs changed while the trial ran ({changed}): which version the"
                    " backend loaded is unknown, so the result is not cached",
                )
                return None
        return key

    def _observe_backend(self, body: Any) -> None:
        """Keep the data fingerprint of a health answer (when one is declared)."""
        if self.backend_fingerprint_field is None:
            return
        if not isinstance(body, Mapping):
            raise TargetError(
                f"target.health.fingerprint {self.backend_fingerprint_field!r} is set, but the health wait returned"
                " no health answer to read it from (wait_healthy must return wait_target_healthy's JSON)"
            )
        self.backend_fingerprint = health_fingerprint(body, self.backend_fingerprint_field)

    def _lookup(self, key: CacheKey, out: TrialOutcome) -> CachedResult | None:
        if self.cache is None:
            return None
        if self.backend_fingerprint_field is not None and key.backend is None:
            out.cache_note = "cache miss: the backend's data fingerprint is unknown until it restarts healthy"
            return None
        cached = self.cache.get(key)
        if cached is None:
            out.cache_note = self.cache.explain_miss(key)
        return cached

    def _lookup_backend_fingerprint(self) -> str | None:
        """What the running backend serves. Before this run's first restart the backend
        the run started is asked once (one health request); after a restart that never
        became healthy it stays unknown (the trial is measured, not looked up)."""
        if self.backend_fingerprint_field is None:
            return None
        if self.backend_fingerprint is None and not self.touched_backend:
            try:
                self._observe_backend(self.wait_healthy())
            except TargetError:
                pass  # the restart of this trial tells (and fails it with the reason)
        return self.backend_fingerprint

    @staticmethod
    def _note(out: TrialOutcome, text: str) -> None:
        out.cache_note = f"{out.cache_note}; {text}" if out.cache_note else text
