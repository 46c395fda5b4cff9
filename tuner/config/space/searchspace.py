"""SearchSpace: a loaded space's parameters in suggestion order, and what the study asks
of them (sample a trial, encode an assignment for ``enqueue_trial``, read the baseline
from the config, turn an assignment into config edits, check the config fits).

An *assignment* maps parameter names (the keys under ``params``/``fixed``; by default
the dotted path itself) to the values written into the config: a scalar, a mapping of
normalised weights for a ``simplex``, a strictly increasing list for an ``ordered``
group. The baseline is the config as found (``current_assignment``: a simplex's
weights as the file has them), and ``as_found`` gives any assignment the file's own
values where it leaves a key unchanged. Each kind's Optuna encoding is its own
(tuner.config.space.scalars, .simplex, .ordered); this class only walks the params.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution

from tuner.config.configpatch import MISSING, all_paths, get_path
from tuner.config.space.checks import check_gates, condition_order
from tuner.config.space.distributions import queued_params, widened
from tuner.config.space.params import ParamSpec
from tuner.config.space.values import matches
from tuner.config.yamlfile import did_you_mean
from tuner.errors import ConfigError
from tuner.files import display_path

Assignment = dict[str, Any]


class SearchSpace:
    """A validated search space, its parameters in suggestion order (conditions first)."""

    def __init__(self, source: Path, params: Sequence[ParamSpec]) -> None:
        self.source = source
        self._params = {p.name: p for p in params}
        self._order = condition_order(source, self._params)
        check_gates(source, params)

    # ---- inspection

    @property
    def params(self) -> list[ParamSpec]:
        return [self._params[n] for n in self._order]

    def __getitem__(self, name: str) -> ParamSpec:
        try:
            return self._params[name]
        except KeyError:
            raise ConfigError(
                f"{display_path(self.source)}: {name}: not a parameter of this space{did_you_mean(name, self._params)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._params

    @property
    def post_retrieval(self) -> frozenset[str]:
        return frozenset(n for n, p in self._params.items() if p.spec.post_retrieval)

    @property
    def file_indices(self) -> frozenset[int]:
        return frozenset(p.file for p in self._params.values())

    def distributions(self) -> dict[str, BaseDistribution]:
        """Every Optuna parameter this space may suggest (conditional ones included)."""
        out: dict[str, BaseDistribution] = {}
        for p in self.params:
            out.update(p.spec.distributions(p.name))
        return out

    def distributions_for(self, params: Mapping[str, Any]) -> dict[str, BaseDistribution]:
        """Distributions for exactly ``params`` (e.g. for ``optuna.trial.create_trial``).

        Numeric ranges are widened to contain the given values: a baseline outside the
        space is still recordable (Optuna's compatibility check ignores bounds).
        """
        dists = self.distributions()
        out: dict[str, BaseDistribution] = {}
        for name, value in params.items():
            if name not in dists:
                raise ConfigError(f"{display_path(self.source)}: {name}: not an Optuna param of this space")
            out[name] = widened(dists[name], value)
        return out

    def active(self, name: str, assignment: Mapping[str, Any]) -> bool:
        """Whether ``name``'s conditions hold in ``assignment`` (conditions must be assigned)."""
        for cond, allowed in self[name].spec.when.items():
            if cond not in assignment or not matches(assignment[cond], allowed):
                return False
        return True

    # ---- sampling

    def suggest(
        self, trial: optuna.trial.BaseTrial, *, skip_post_retrieval: bool = False, skip: Collection[str] = ()
    ) -> Assignment:
        """Ask ``trial`` for every active parameter; fixed values are included.

        With ``skip_post_retrieval`` the post-retrieval params are left out (the trial
        runner solves them from the retrieval, tuner.study.gates.threshold) unless the trial was
        queued with a value for them: the baseline and a shortlist variant that names
        a threshold are measured at that value, not at a solved one. ``skip`` leaves out
        more params the same way (the fusion params replayed per trial, tuner.config.replay).
        """
        queued = queued_params(trial) if (skip_post_retrieval or skip) else {}
        out: Assignment = {}
        for p in self.params:
            solved = (skip_post_retrieval and p.spec.post_retrieval) or p.name in skip
            if solved and not _queued(p, queued):
                continue
            if self.active(p.name, out):
                out[p.name] = p.spec.suggest(trial, p.name)
        return out

    def params_for(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna params that make :meth:`suggest` return ``assignment`` (for enqueue_trial).

        A partial assignment gives partial params (Optuna samples the rest). Raises
        ConfigError when a value cannot be represented (unknown name, value not among the
        choices, a fixed key set to another value, an inactive param, an unordered list).
        """
        out: dict[str, Any] = {}
        for name, value in assignment.items():
            p = self[name]
            conds = p.spec.when
            if conds and all(c in assignment for c in conds) and not self.active(name, assignment):
                needs = ", ".join(f"{c}={assignment[c]!r} (needs {allowed!r})" for c, allowed in conds.items())
                raise self._error(p, f"inactive when {needs} (drop it from the variant)")
            try:
                out.update(p.spec.encode(p.name, value))
            except ValueError as exc:
                raise self._error(p, str(exc)) from exc
        return out

    def current_assignment(self, configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Assignment:
        """The assignment the config files hold now (fixed params excluded), each value as
        the file has it (a simplex's weights not normalised): the baseline."""
        docs = _as_docs(configs)
        out: Assignment = {}
        for p in self.params:
            if not p.spec.tuned or not self.active(p.name, out):
                continue
            value = get_path(docs[p.file], p.path)
            if value is MISSING:
                raise self._error(p, "no such key in the config (run validate_against first)")
            out[p.name] = p.spec.from_config(value)
        return out

    def as_found(
        self, assignment: Mapping[str, Any], configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> Assignment:
        """``assignment`` with each value that leaves its key as the config files hold it
        replaced by the file's own value (each kind decides, ``ParamKind.as_found``): the
        baseline, and any trial that keeps a key, records and writes the config as found
        (weights 1.0/1.0 stay 1.0/1.0, not the simplex's 0.5/0.5)."""
        found = self.current_assignment(configs)
        return {
            name: self._params[name].spec.as_found(value, found[name]) if name in found else value
            for name, value in assignment.items()
        }

    def edits(self, assignment: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        """``{file index: {dotted path: value}}`` to hand to the config patcher."""
        out: dict[int, dict[str, Any]] = {}
        for name, value in assignment.items():
            p = self[name]
            out.setdefault(p.file, {})[p.path] = p.spec.to_config(value)
        return out

    # ---- validation against the target config

    def validate_against(
        self, configs: Mapping[str, Any] | Sequence[Mapping[str, Any]], names: Sequence[str] = ()
    ) -> list[str]:
        """Check every path exists with a compatible type; ConfigError on the first problem.

        Returns warnings (e.g. the current value lies outside the declared range, so the
        baseline trial will be enqueued outside the space).
        """
        docs = _as_docs(configs)
        warnings: list[str] = []
        for p in self.params:
            if p.file >= len(docs):
                raise self._error(p, f"file {p.file} does not exist: the target has {len(docs)} config file(s)")
            cfg_name = names[p.file] if p.file < len(names) else f"config file {p.file}"
            value = get_path(docs[p.file], p.path)
            if value is MISSING:
                hint = did_you_mean(p.path, all_paths(docs[p.file]))
                raise self._error(p, f"no such key in {cfg_name}{hint}", key=p.path)
            problem = p.spec.type_problem(value)
            if problem:
                raise self._error(p, f"type mismatch: {problem}", key=p.path)
            warning = p.spec.range_warning(value)
            if warning:
                warnings.append(f"{self._where(p)}: {p.name}: {warning}")
        return warnings

    def _where(self, p: ParamSpec) -> str:
        return display_path(self.source) + (f":{p.line}" if p.line else "")

    def _error(self, p: ParamSpec, message: str, key: str | None = None) -> ConfigError:
        return ConfigError(f"{self._where(p)}: {key or p.name}: {message}")


def _queued(p: ParamSpec, queued: Mapping[str, Any]) -> bool:
    """Whether the trial was queued with a value for ``p`` (all of its Optuna params)."""
    names = list(p.spec.distributions(p.name)) or [p.name]
    return all(n in queued for n in names)


def _as_docs(configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [configs] if isinstance(configs, Mapping) else list(configs)
