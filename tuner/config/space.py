"""Search spaces: which config keys a study tunes, and how (search_space/*.yaml).

A search space is data. Each entry of ``params`` names a dotted path into one of the
target's config files and says how to sample it::

    file: 0                          # default config file (index into target.config_files, or a path)
    params:
      fusion.method: {type: categorical, choices: [rrf, linear]}
      fusion.rrf_k:  {type: int, low: 5, high: 200, log: true, when: {fusion.method: rrf}}
      fusion.weights: {type: simplex, components: [bm25, dense]}
      fallback.windows_days:
        type: ordered
        length: 2
        first: {low: 7, high: 60}
        gap: {low: 1, high: 180}
      rag.min_confidence: {type: float, low: 0.2, high: 0.9, gate: confidence}   # solved per trial
    fixed:
      sources.bm25.depth: 100

Public API (used by the study and ``tuner apply``)::

    load_space(path, config_files=()) -> SearchSpace
    SearchSpace.validate_against(configs, names=()) -> list[str]      # warnings; ConfigError on errors
    SearchSpace.suggest(trial) -> Assignment                           # includes fixed values
    SearchSpace.params_for(assignment) -> dict[str, Any]               # for study.enqueue_trial
    SearchSpace.current_assignment(configs) -> Assignment              # the baseline
    SearchSpace.distributions() -> dict[str, BaseDistribution]         # every Optuna param it may suggest
    SearchSpace.distributions_for(params) -> dict[str, BaseDistribution]  # for create_trial(params=...)
    SearchSpace.edits(assignment) -> dict[int, dict[str, Any]]         # file index -> {dotted path: value}
    SearchSpace.active(name, assignment) -> bool
    SearchSpace.post_retrieval -> frozenset[str]                       # gate-only param names
    ParamSpec.gate -> "confidence" | "min_score" | None                # a gate's role

An *assignment* maps parameter names (the keys under ``params``/``fixed``; by default
the dotted path itself) to the values written into the config: a scalar, a mapping of
normalised weights for a ``simplex``, a strictly increasing list for an ``ordered``
group. Optuna parameters are an internal encoding of it:

- scalar params: the Optuna param has the same name and value;
- ``simplex`` of n components: n-1 params ``NAME:COMPONENT`` uniform in [0, 1] decoded by
  stick-breaking with Beta(1, n-1-i) inverse CDFs, which maps the unit cube onto the
  simplex *uniformly* (a flat Dirichlet) and one-to-one, so two proposals never differ
  only by a scaling of the weights;
- ``ordered`` group: ``NAME:first`` then ``NAME:gapI`` (next = previous + gap > 0) or
  ``NAME:ratioI`` (next = previous * ratio, ratio > 1), so an unordered list is never
  proposed.

A parameter with ``when: {other: value | [values]}`` is active only when every named
parameter is active and has one of those values; an inactive parameter is neither
suggested nor written (the config keeps its value).

A *gate* (``gate: confidence`` or ``gate: min_score``, which implies ``post_retrieval``)
only filters what one retrieval returned, so tuner.study.threshold solves it per trial
instead of sampling it. The role, not the key, says how: a backend may call its
confidence gate ``rag.min_confidence``. On the reference backend's own keys
(``REFERENCE_GATES``) ``post_retrieval: true`` alone implies the role.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from tuner.config.configpatch import MISSING, all_paths, get_path
from tuner.config.yamlfile import did_you_mean, display_path, line_of, load_model, read_yaml
from tuner.errors import ConfigError

Scalar = Union[str, bool, int, float]  # noqa: UP007 - pydantic tries members in order
Assignment = dict[str, Any]

__all__ = ["Assignment", "SearchSpace", "load_space", "ParamSpec", "GATE_ROLES", "REFERENCE_GATES"]

#: ``confidence``: hand a query off when the response's confidence < value;
#: ``min_score``: drop results scoring < value (an emptied list is handed off).
GateRole = Literal["confidence", "min_score"]
GATE_ROLES: tuple[str, ...] = ("confidence", "min_score")
#: The reference backend's gate keys: spaces written before ``gate:`` existed name no role.
REFERENCE_GATES: dict[str, str] = {"confidence.threshold": "confidence", "citation.min_score": "min_score"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Common(_Model):
    path: str | None = Field(default=None, description="Dotted config path; default: the param's name.")
    file: int | str | None = Field(default=None, description="Config file index or path; default: the space's file.")
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    post_retrieval: bool = Field(default=False, description="Only gates results after retrieval (issue 6).")
    gate: GateRole | None = Field(default=None, description="A post-retrieval gate's role; implies post_retrieval.")

    @model_validator(mode="before")
    @classmethod
    def _gate_implies_post_retrieval(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gate") is not None:
            if data.get("post_retrieval") is False:
                raise ValueError("gate: implies post_retrieval: true; drop post_retrieval: false")
            data = {**data, "post_retrieval": True}
        return data


def _check_bounds(low: float, high: float, log: bool, step: float | None) -> None:
    if low > high:
        raise ValueError(f"inverted bounds low={low} > high={high}, swap them")
    if log and low <= 0:
        raise ValueError(f"log scale needs low > 0, got low={low} (raise low or drop log)")
    if log and step is not None and step != 1:
        raise ValueError(f"log scale cannot be combined with step={step} (drop one of them)")


class FloatParam(_Common):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> "FloatParam":
        _check_bounds(self.low, self.high, self.log, self.step)
        return self

    def distribution(self) -> FloatDistribution:
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


class IntParam(_Common):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: PositiveInt = 1

    @model_validator(mode="after")
    def _bounds(self) -> "IntParam":
        _check_bounds(self.low, self.high, self.log, self.step)
        return self

    def distribution(self) -> IntDistribution:
        return IntDistribution(self.low, self.high, log=self.log, step=self.step)


class CategoricalParam(_Common):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _unique(cls, v: list[Scalar]) -> list[Scalar]:
        seen = [repr(c) for c in v]
        dup = {c for c in seen if seen.count(c) > 1}
        if dup:
            raise ValueError(f"duplicate choices {sorted(dup)} (list each choice once)")
        return v

    def distribution(self) -> CategoricalDistribution:
        return CategoricalDistribution(self.choices)


class FixedParam(_Common):
    type: Literal["fixed"]
    value: Any


class SimplexParam(_Common):
    """Weights on a simplex: one share per component, written normalised to ``total``."""

    type: Literal["simplex"]
    components: list[str] = Field(min_length=2)
    total: float = Field(default=1.0, gt=0)
    decimals: int = Field(default=4, ge=1, le=12)

    @field_validator("components")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate components in {v} (list each once)")
        return v


class Range(_Model):
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> "Range":
        _check_bounds(self.low, self.high, self.log, self.step)
        return self


class OrderedParam(_Common):
    """A strictly increasing list: ``first``, then each next = previous + gap (or * ratio)."""

    type: Literal["ordered"]
    length: int = Field(ge=2)
    first: Range
    gap: Range | None = None
    ratio: Range | None = None
    integer: bool = True

    @model_validator(mode="after")
    def _shape(self) -> "OrderedParam":
        if (self.gap is None) == (self.ratio is None):
            raise ValueError("give exactly one of gap (next = previous + gap) or ratio (next = previous * ratio)")
        if self.gap is not None and self.gap.low <= 0:
            raise ValueError(f"gap.low must be > 0 so the list stays strictly increasing, got {self.gap.low}")
        if self.ratio is not None and self.ratio.low <= 1:
            raise ValueError(f"ratio.low must be > 1 so the list stays strictly increasing, got {self.ratio.low}")
        if self.ratio is not None and self.first.low <= 0:
            raise ValueError(f"ratio needs first.low > 0, got {self.first.low}")
        if self.integer:
            for label, rng in (("first", self.first), ("gap", self.gap)):
                if rng is not None and not all(float(x).is_integer() for x in (rng.low, rng.high)):
                    raise ValueError(f"{label} bounds must be whole numbers when integer: true")
        return self


Param = Annotated[
    Union[FloatParam, IntParam, CategoricalParam, FixedParam, SimplexParam, OrderedParam],  # noqa: UP007
    Field(discriminator="type"),
]


class SpaceFile(_Model):
    """The YAML document of a search-space file."""

    description: str | None = None
    file: int | str = 0
    params: dict[str, Param] = Field(default_factory=dict)
    fixed: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_overlap(self) -> "SpaceFile":
        both = sorted(set(self.params) & set(self.fixed))
        if both:
            raise ValueError(f"{both[0]} is both tuned (params) and fixed (remove one)")
        if not self.params and not self.fixed:
            raise ValueError("the space has no params (add at least one under params:)")
        return self


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a loaded space, its config location resolved."""

    name: str
    path: str
    file: int
    spec: FloatParam | IntParam | CategoricalParam | FixedParam | SimplexParam | OrderedParam
    line: int | None

    @property
    def kind(self) -> str:
        return self.spec.type

    @property
    def gate(self) -> str | None:
        """A post-retrieval param's role: declared with ``gate:``, else the reference key's own."""
        if not self.spec.post_retrieval:
            return None
        return self.spec.gate or REFERENCE_GATES.get(self.path)


# ---------------------------------------------------------------- numeric encodings


def _decimals_of(step: float) -> int:
    return max(0, -Decimal(repr(step)).normalize().as_tuple().exponent)  # type: ignore[operator]


def _clean_float(value: float, step: float | None) -> float:
    """Drop the binary noise a stepped float picks up (0.30000000000000004 -> 0.3)."""
    return round(value, _decimals_of(step)) if step else value


def sticks_to_shares(us: Sequence[float], total: float = 1.0, decimals: int | None = None) -> list[float]:
    """Stick-breaking: n-1 uniforms -> n shares of a flat Dirichlet, summing to ``total``."""
    n = len(us) + 1
    rest = 1.0
    shares: list[float] = []
    for i, u in enumerate(us):
        v = 1.0 - (1.0 - min(max(u, 0.0), 1.0)) ** (1.0 / (n - 1 - i))
        shares.append(rest * v)
        rest -= rest * v
    shares.append(max(rest, 0.0))
    shares = [s * total for s in shares]
    if decimals is not None:
        head = [round(s, decimals) for s in shares[:-1]]
        # The last share absorbs rounding so the written weights sum to total exactly.
        shares = head + [max(round(total - sum(head), decimals), 0.0)]
    return shares


def shares_to_sticks(shares: Sequence[float]) -> list[float]:
    """Inverse of :func:`sticks_to_shares` (input need not be normalised)."""
    s = [float(x) for x in shares]
    if any(x < 0 for x in s) or sum(s) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(shares)}")
    total = sum(s)
    n = len(s)
    rest = 1.0
    us: list[float] = []
    for i in range(n - 1):
        share = s[i] / total
        v = min(share / rest, 1.0) if rest > 1e-15 else 0.0
        us.append(1.0 - (1.0 - v) ** (n - 1 - i))
        rest -= share
    return us


# ---------------------------------------------------------------- the space


class SearchSpace:
    """A validated search space, its parameters in suggestion order (conditions first)."""

    def __init__(self, source: Path, params: Sequence[ParamSpec]) -> None:
        self.source = source
        self._params = {p.name: p for p in params}
        self._order = _condition_order(source, self._params)
        _check_gates(source, params)

    # ---- inspection

    @property
    def params(self) -> list[ParamSpec]:
        return [self._params[n] for n in self._order]

    def __getitem__(self, name: str) -> ParamSpec:
        try:
            return self._params[name]
        except KeyError:
            raise ConfigError(
                f"{display_path(self.source)}: {name}: not a parameter of this space"
                f"{did_you_mean(name, self._params)}"
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
            out.update(_encoded_distributions(p))
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
            out[name] = _widened(dists[name], value)
        return out

    def active(self, name: str, assignment: Mapping[str, Any]) -> bool:
        """Whether ``name``'s conditions hold in ``assignment`` (conditions must be assigned)."""
        for cond, allowed in self[name].spec.when.items():
            if cond not in assignment or not _matches(assignment[cond], allowed):
                return False
        return True

    # ---- sampling

    def suggest(self, trial: optuna.trial.BaseTrial, *, skip_post_retrieval: bool = False) -> Assignment:
        """Ask ``trial`` for every active parameter; fixed values are included.

        With ``skip_post_retrieval`` the post-retrieval params are left out (the trial
        runner solves them from the retrieval, tuner.study.threshold) unless the trial was
        queued with a value for them: the baseline and a shortlist variant that names
        a threshold are measured at that value, not at a solved one.
        """
        queued = _queued_params(trial) if skip_post_retrieval else {}
        out: Assignment = {}
        for p in self.params:
            if skip_post_retrieval and p.spec.post_retrieval and p.name not in queued:
                continue
            if self.active(p.name, out):
                out[p.name] = _suggest(trial, p)
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
                raise self._error(p, f"inactive when {_fmt_when(conds, assignment)} (drop it from the variant)")
            try:
                out.update(_encode(p, value))
            except ValueError as exc:
                raise self._error(p, str(exc)) from exc
        return out

    def current_assignment(self, configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Assignment:
        """The assignment the config files hold now (fixed params excluded): the baseline."""
        docs = _as_docs(configs)
        out: Assignment = {}
        for p in self.params:
            if p.kind == "fixed" or not self.active(p.name, out):
                continue
            value = get_path(docs[p.file], p.path)
            if value is MISSING:
                raise self._error(p, "no such key in the config (run validate_against first)")
            out[p.name] = _from_config(p, value)
        return out

    def edits(self, assignment: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        """``{file index: {dotted path: value}}`` to hand to the config patcher."""
        out: dict[int, dict[str, Any]] = {}
        for name, value in assignment.items():
            p = self[name]
            out.setdefault(p.file, {})[p.path] = value
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
            problem = _type_problem(p, value)
            if problem:
                raise self._error(p, f"type mismatch: {problem}", key=p.path)
            warning = _range_warning(p, value)
            if warning:
                warnings.append(f"{self._where(p)}: {p.name}: {warning}")
        return warnings

    def _where(self, p: ParamSpec) -> str:
        return display_path(self.source) + (f":{p.line}" if p.line else "")

    def _error(self, p: ParamSpec, message: str, key: str | None = None) -> ConfigError:
        return ConfigError(f"{self._where(p)}: {key or p.name}: {message}")


# ---------------------------------------------------------------- loading


def load_space(path: Path | str, config_files: Sequence[Path | str] = ()) -> SearchSpace:
    """Read and validate a search-space file.

    ``config_files`` (the experiment's ``target.config_files``) lets params name their
    file by path (``file: backend/config.yaml``); a path matches a config file when it
    is that file or a trailing part of its path. Integer ``file`` indexes the list.
    """
    path = Path(path)
    doc = read_yaml(path)
    model = load_model(path, SpaceFile, data=doc)
    files = [Path(f) for f in config_files]
    specs: list[ParamSpec] = []
    entries: list[tuple[str, Any, tuple[str, ...]]] = [(n, s, ("params", n)) for n, s in model.params.items()]
    entries += [(n, FixedParam(type="fixed", value=v), ("fixed", n)) for n, v in model.fixed.items()]
    for name, spec, loc in entries:
        line = line_of(doc, loc)
        where = display_path(path) + (f":{line}" if line else "")
        ref = spec.file if spec.file is not None else model.file
        try:
            index = _resolve_file(ref, files, path.parent)
        except ValueError as exc:
            raise ConfigError(f"{where}: {name}: {exc}") from None
        specs.append(ParamSpec(name=name, path=spec.path or name, file=index, spec=spec, line=line))
    _check_conditions(path, specs)
    return SearchSpace(path, specs)


def _resolve_file(ref: int | str, files: Sequence[Path], base: Path) -> int:
    if isinstance(ref, int):
        if ref < 0 or (files and ref >= len(files)):
            raise ValueError(f"file: {ref} is out of range (the target has {len(files)} config file(s))")
        return ref
    wanted = Path(ref)
    if not files:
        raise ValueError(f"file: {ref} needs the experiment's target.config_files to resolve (or use an index)")
    for i, f in enumerate(files):
        if (base / wanted).resolve() == f.resolve() or f.parts[-len(wanted.parts):] == wanted.parts:
            return i
    raise ValueError(f"file: {ref} matches none of target.config_files {[str(f) for f in files]}")


def _check_conditions(path: Path, specs: Sequence[ParamSpec]) -> None:
    by_name = {p.name: p for p in specs}
    for p in specs:
        where = display_path(path) + (f":{p.line}" if p.line else "")
        for cond, allowed in p.spec.when.items():
            other = by_name.get(cond)
            if other is None:
                raise ConfigError(
                    f"{where}: {p.name}: when: {cond} is not a parameter of this space"
                    f"{did_you_mean(cond, by_name)} (conditions name params or fixed keys)"
                )
            if other.kind in ("simplex", "ordered"):
                raise ConfigError(f"{where}: {p.name}: when: {cond} is a {other.kind} group (condition on a scalar)")
            if isinstance(other.spec, CategoricalParam):
                for value in allowed if isinstance(allowed, list) else [allowed]:
                    if not any(_same(value, c) for c in other.spec.choices):
                        raise ConfigError(
                            f"{where}: {p.name}: when: {cond}: {value!r} is not one of its choices "
                            f"{other.spec.choices}{did_you_mean(str(value), [str(c) for c in other.spec.choices])}"
                        )


def _check_gates(source: Path, specs: Sequence[ParamSpec]) -> None:
    """Every post-retrieval param is a float gate with a known role, one param per role."""
    seen: dict[str, str] = {}
    for p in specs:
        if not p.spec.post_retrieval:
            continue
        where = display_path(source) + (f":{p.line}" if p.line else "")
        if p.kind != "float":
            raise ConfigError(
                f"{where}: {p.name}: post_retrieval/gate needs a float (solved from one retrieval), this is "
                f"{p.kind}; remove post_retrieval/gate so the sampler searches it"
            )
        if p.gate is None:
            raise ConfigError(
                f"{where}: {p.name}: post_retrieval: true does not say which gate it is; add gate: confidence "
                "(hand off when the response's confidence < value) or gate: min_score (drop results scoring < value)"
            )
        if p.gate in seen:
            raise ConfigError(
                f"{where}: {p.name}: a second gate: {p.gate} (after {seen[p.gate]}); one param per role can be "
                "solved, remove post_retrieval/gate from one of them"
            )
        seen[p.gate] = p.name


def _condition_order(source: Path, params: Mapping[str, ParamSpec]) -> list[str]:
    """Declaration order, but every condition's param before the params it gates."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join([*chain, name])
            raise ConfigError(f"{display_path(source)}: {name}: conditions form a cycle {cycle} (break it)")
        state[name] = "visiting"
        for cond in params[name].spec.when:
            if cond in params:
                visit(cond, [*chain, name])
        state[name] = "done"
        order.append(name)

    for name in params:
        visit(name, [])
    return order


# ---------------------------------------------------------------- per-kind helpers


def _as_docs(configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [configs] if isinstance(configs, Mapping) else list(configs)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        isinstance(a, int | float) and isinstance(b, int | float)
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b
    )


def _matches(value: Any, allowed: Any) -> bool:
    return any(_same(value, a) for a in (allowed if isinstance(allowed, list) else [allowed]))


def _fmt_when(conds: Mapping[str, Any], assignment: Mapping[str, Any]) -> str:
    return ", ".join(f"{c}={assignment[c]!r} (needs {allowed!r})" for c, allowed in conds.items())


def _encoded_distributions(p: ParamSpec) -> dict[str, BaseDistribution]:
    s = p.spec
    if isinstance(s, FloatParam | IntParam | CategoricalParam):
        return {p.name: s.distribution()}
    if isinstance(s, SimplexParam):
        return {f"{p.name}:{c}": FloatDistribution(0.0, 1.0) for c in s.components[:-1]}
    if isinstance(s, OrderedParam):
        out = {f"{p.name}:first": _range_dist(s.first, s.integer)}
        step_kind, rng = ("gap", s.gap) if s.gap is not None else ("ratio", s.ratio)
        assert rng is not None
        for i in range(1, s.length):
            out[f"{p.name}:{step_kind}{i}"] = _range_dist(rng, s.integer and step_kind == "gap")
        return out
    return {}


def _range_dist(r: Range, integer: bool) -> BaseDistribution:
    if integer:
        return IntDistribution(int(r.low), int(r.high), log=r.log, step=int(r.step or 1))
    return FloatDistribution(r.low, r.high, log=r.log, step=r.step)


def _widened(dist: BaseDistribution, value: Any) -> BaseDistribution:
    if isinstance(dist, IntDistribution | FloatDistribution) and not dist._contains(value):
        low, high = min(dist.low, value), max(dist.high, value)
        if dist.step is not None and not dist.log:
            # Keep the grid: move the new bound onto it.
            span = math.ceil((high - low) / dist.step - 1e-9) * dist.step
            low, high = (value, value + span) if value < dist.low else (low, low + span)
        if isinstance(dist, IntDistribution):
            return IntDistribution(int(low), int(high), log=dist.log, step=dist.step)
        return FloatDistribution(low, high, log=dist.log, step=dist.step)
    return dist


def _queued_params(trial: optuna.trial.BaseTrial) -> Mapping[str, Any]:
    """The params ``study.enqueue_trial`` fixed for ``trial`` (an optuna.Trial); empty otherwise."""
    storage, trial_id = getattr(trial, "storage", None), getattr(trial, "_trial_id", None)
    if storage is None or trial_id is None:
        return {}
    return storage.get_trial_system_attrs(trial_id).get("fixed_params") or {}


def _suggest_one(trial: optuna.trial.BaseTrial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        value = trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
        return _clean_float(value, dist.step)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise TypeError(f"unsupported distribution {dist!r}")


def _suggest(trial: optuna.trial.BaseTrial, p: ParamSpec) -> Any:
    s = p.spec
    if isinstance(s, FixedParam):
        return s.value
    values = {n: _suggest_one(trial, n, d) for n, d in _encoded_distributions(p).items()}
    if isinstance(s, SimplexParam):
        shares = sticks_to_shares(list(values.values()), s.total, s.decimals)
        return dict(zip(s.components, shares, strict=True))
    if isinstance(s, OrderedParam):
        return _decode_ordered(s, list(values.values()))
    return values[p.name]


def _decode_ordered(s: OrderedParam, raw: Sequence[float]) -> list[float | int]:
    out: list[float | int] = [int(raw[0]) if s.integer else float(raw[0])]
    for step in raw[1:]:
        prev = out[-1]
        if s.gap is not None:
            nxt: float | int = prev + step
        else:
            nxt = prev * step
            if s.integer:
                nxt = max(int(prev) + 1, round(nxt))
        out.append(nxt)
    return out


def _encode(p: ParamSpec, value: Any) -> dict[str, Any]:
    """Assignment value -> Optuna params; ValueError with the reason when impossible."""
    s = p.spec
    if isinstance(s, FixedParam):
        if not (_same(value, s.value) or value == s.value):
            raise ValueError(f"is fixed to {s.value!r} by the space; a variant cannot set {value!r}")
        return {}
    if isinstance(s, CategoricalParam):
        for choice in s.choices:
            if _same(value, choice):
                return {p.name: choice}
        raise ValueError(f"{value!r} is not one of the choices {s.choices} (add it to choices)")
    if isinstance(s, IntParam):
        if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
            raise ValueError(f"{value!r} is not a whole number")
        return {p.name: int(value)}
    if isinstance(s, FloatParam):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not a number")
        return {p.name: float(value)}
    if isinstance(s, SimplexParam):
        shares = _simplex_values(s, value)
        us = shares_to_sticks(shares)
        return {f"{p.name}:{c}": u for c, u in zip(s.components[:-1], us, strict=True)}
    if isinstance(s, OrderedParam):
        return _encode_ordered(p.name, s, value)
    raise ValueError(f"cannot encode {p.kind}")


def _simplex_values(s: SimplexParam, value: Any) -> list[float]:
    if isinstance(value, Mapping):
        missing = [c for c in s.components if c not in value]
        extra = [k for k in value if k not in s.components]
        if missing or extra:
            raise ValueError(f"weights must name exactly the components {s.components}, got {list(value)}")
        return [float(value[c]) for c in s.components]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == len(s.components):
        return [float(v) for v in value]
    raise ValueError(f"expected a mapping of {s.components} to weights, got {value!r}")


def _encode_ordered(name: str, s: OrderedParam, value: Any) -> dict[str, Any]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != s.length:
        raise ValueError(f"expected a list of {s.length} numbers, got {value!r}")
    vals = [float(v) for v in value]
    if any(b <= a for a, b in zip(vals, vals[1:], strict=False)):
        raise ValueError(f"{list(value)} is not strictly increasing (ordered groups only propose increasing lists)")
    out: dict[str, Any] = {f"{name}:first": int(vals[0]) if s.integer else vals[0]}
    for i in range(1, s.length):
        if s.gap is not None:
            gap = vals[i] - vals[i - 1]
            out[f"{name}:gap{i}"] = int(gap) if s.integer else gap
        else:
            if vals[i - 1] <= 0:
                raise ValueError(f"ratio encoding needs positive values, got {list(value)}")
            out[f"{name}:ratio{i}"] = vals[i] / vals[i - 1]
    return out


def _from_config(p: ParamSpec, value: Any) -> Any:
    s = p.spec
    if isinstance(s, SimplexParam):
        shares = [float(value[c]) for c in s.components]
        norm = sticks_to_shares(shares_to_sticks(shares), s.total, s.decimals)
        return dict(zip(s.components, norm, strict=True))
    if isinstance(s, OrderedParam):
        return [int(v) if s.integer and float(v).is_integer() else float(v) for v in value]
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def _family(kind: str) -> str:
    return "number" if kind in ("int", "float") else kind


def _type_problem(p: ParamSpec, value: Any) -> str | None:
    """Why ``value`` (the config's) cannot take this param's values, or None."""
    s = p.spec
    have = _kind(value)
    if isinstance(s, FloatParam | IntParam):
        if have not in ("int", "float", "null"):
            return f"config has {have}, space declares {s.type} (point the key at a number or change the type)"
        if isinstance(s, IntParam) and have == "float" and not float(value).is_integer():
            return f"config has float {value}, space declares int (use type: float)"
        return None
    if isinstance(s, CategoricalParam):
        kinds = sorted({_kind(c) for c in s.choices})
        if have != "null" and any(_family(k) != _family(have) for k in kinds):
            return (
                f"config has {have}, space declares categorical of {'/'.join(kinds)} "
                f"(make the choices {have} values)"
            )
        return None
    if isinstance(s, FixedParam):
        want = _kind(s.value)
        if have != "null" and want != "null" and _family(want) != _family(have):
            return f"config has {have}, fixed value {s.value!r} is {want} (write a {have} value)"
        return None
    if isinstance(s, SimplexParam):
        if not isinstance(value, Mapping):
            return f"config has {have}, a simplex needs a mapping of component -> weight"
        for c in s.components:
            if c not in value:
                return f"component {c} is not a key of the config mapping {list(value)}{did_you_mean(c, value)}"
            if _kind(value[c]) not in ("int", "float"):
                return f"config weight {c} is {_kind(value[c])}, expected a number"
        return None
    if isinstance(s, OrderedParam):
        if not isinstance(value, list | tuple):
            return f"config has {have}, an ordered group needs a list of numbers"
        kinds = {_kind(v) for v in value}
        if not kinds <= {"int", "float"}:
            return f"config list holds {sorted(kinds)}, an ordered group needs numbers"
        if s.integer and "float" in kinds:
            return "config list holds floats, space declares integer: true (set integer: false)"
        # integer: false over an int list is allowed: floats where ints were is an explicit choice.
        return None
    return None


def _range_warning(p: ParamSpec, value: Any) -> str | None:
    s = p.spec
    if isinstance(s, FloatParam | IntParam) and isinstance(value, int | float) and not isinstance(value, bool):
        if not s.low <= value <= s.high:
            return f"current value {value} lies outside [{s.low}, {s.high}]; the baseline trial is enqueued outside the space"
    if isinstance(s, CategoricalParam) and value is not None and not any(_same(value, c) for c in s.choices):
        return f"current value {value!r} is not among the choices {s.choices}; the baseline cannot be enqueued"
    if isinstance(s, OrderedParam) and isinstance(value, list | tuple) and len(value) != s.length:
        return f"current list has {len(value)} values, the space proposes {s.length}"
    return None

