"""A trial's result-cache side: its cache key (config texts, evaluation fingerprints,
declared target.inputs, the backend's data fingerprint), the lookup, and the key a
measured result is stored under.

`CacheLookup` owns the result cache and the declared inputs; it reads what the backend
serves from the `ServedBackend` the measurer keeps (tuner.study.trial.measure).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tuner.config.objective import Constraint, Objective
from tuner.data.inputs import changed_files, describe_files
from tuner.study.storage.result_cache import CachedResult, CacheKey, ResultCache, cache_key, short_fingerprint
from tuner.study.trial.config_names import ConfigNames
from tuner.study.trial.interfaces import InputsLike
from tuner.study.trial.measure import ServedBackend
from tuner.study.trial.outcome import TrialOutcome

if TYPE_CHECKING:
    from tuner.study.gates.threshold import GateRange


class Fingerprinted(Protocol):
    """The evaluator's fingerprints that are part of the key (tuner.study.trial.interfaces.BatchEvaluator)."""

    dataset_hash: str
    labels_fingerprint: str
    spec_fingerprint: str


@dataclass
class CacheLookup:
    """The cache-key, lookup and store steps of a trial (module doc); ``cache`` None: no cache."""

    study_name: str  # a stored result names the study and trial it was measured in
    evaluator: Fingerprinted
    served: ServedBackend
    cache: ResultCache | None = None
    objective: Objective = field(default_factory=Objective)
    constraints: Sequence[Constraint] = ()
    # The declared target.inputs (hashed at the first trial, re-stat'ed before each one).
    inputs: InputsLike | None = None
    names: ConfigNames = field(default_factory=ConfigNames)

    def key(self, texts: Mapping[Path, str], solving: Mapping[str, GateRange] | None = None) -> CacheKey:
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
            self.names.texts(texts),
            dataset_hash=self.evaluator.dataset_hash,
            labels_fingerprint=self.evaluator.labels_fingerprint,
            eval_spec_json=spec,
        )
        inputs = self.inputs.current() if self.inputs is not None else None
        backend = self.served.current() if self.cache is not None else self.served.fingerprint
        return CacheKey(base, inputs, backend)

    def measured_key(self, key: CacheKey, out: TrialOutcome) -> CacheKey | None:
        """The key a measured result is stored under: with the backend fingerprint of
        this trial's own health answer after its reload or restart (the data it was
        measured on: ``out.backend_fingerprint``, kept by the measure stage), or None (not
        stored) when a declared input changed while the trial ran (which version the
        backend loaded is unknown)."""
        now_serving = out.backend_fingerprint
        if self.served.fingerprint_field is not None and now_serving != key.backend:
            if self.cache is not None and key.backend is not None:
                _note(
                    out,
                    f"backend fingerprint after this trial's {_how(out.applied)}: {short_fingerprint(now_serving)}"
                    f" (looked up with {short_fingerprint(key.backend)})",
                )
            key = replace(key, backend=now_serving)
            out.backend_fingerprint = key.backend
        if self.inputs is not None and key.inputs is not None:
            now = self.inputs.current()
            if now.digest != key.inputs.digest:
                changed = describe_files(changed_files(key.inputs.files, now.files))
                _note(
                    out,
                    f"target.inputs changed while the trial ran ({changed}): which version the"
                    " backend loaded is unknown, so the result is not cached",
                )
                return None
        return key

    def lookup(self, key: CacheKey, out: TrialOutcome) -> CachedResult | None:
        if self.cache is None:
            return None
        if self.served.fingerprint_field is not None and key.backend is None:
            out.cache_note = "cache miss: the backend's data fingerprint is unknown until it restarts healthy"
            return None
        cached = self.cache.get(key)
        if cached is None:
            out.cache_note = self.cache.explain_miss(key)
        return cached

    def store(self, key: CacheKey | None, out: TrialOutcome, number: int) -> None:
        """Keep trial ``number``'s measured result (``out``'s metrics and report files)
        under ``key`` (None: not cacheable, see ``measured_key``)."""
        if self.cache is not None and key is not None:
            self.cache.put(key, CachedResult(out.metrics, out.reports, number, self.study_name))


def _how(applied: str | None) -> str:
    """How the backend came to serve a trial's config, as a note names it."""
    mode = (applied or "").split(":")[0]
    return {"reload": "reload", "restart": "restart"}.get(mode, "health check")


def _note(out: TrialOutcome, text: str) -> None:
    out.cache_note = f"{out.cache_note}; {text}" if out.cache_note else text
