"""The fusion search inside a trial (pure): which settings of the replayed params to
score from one explained retrieval, scoring them, and ranking them for live verification.

``ReplayPlan`` binds the experiment's ``replay:`` section (tuner.config.replay) to the
search space: the replayed params in the space's condition order, each with its role in
the fusion model. Its grid takes each categorical's choices, each numeric range at
``points`` values (geometric on a log range, on the declared step otherwise) and each
weights simplex on a lattice of ``weight_step``, unless ``grid`` declares a param's values;
conditions (``when:``) are honoured, so ``fusion.rrf_k`` varies only where ``fusion.method``
is ``rrf``. ``search`` scores the whole grid when it has at most ``max_settings`` settings,
else ``max_settings`` settings proposed by a seeded TPE over the same params (their declared distributions).

A setting is scored by a callable (the trial's: replay every query, evaluate the
responses like a live batch, solve the gates) returning a ``Scored``; ``ranked`` orders
them feasible first, best objective, least violation, then grid order.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import optuna
import pandas as pd

from tuner.config.flatten import flatten
from tuner.config.replay import ROLE_CHOICES, ReplayConfig, SubscoreFusion, role_kinds, weight_source
from tuner.errors import ConfigError
from tuner.evaluation.fusion_replay import FusionSetting
from tuner.study.feasibility import constraints_hold

#: the FusionSetting field of each role (the same names, but said once)
_FIELD = {
    "method": "method",
    "rrf_k": "rrf_k",
    "weights": "weights",
    "normalization": "normalization",
    "recency_weight": "recency_weight",
    "recency_half_life_days": "recency_half_life_days",
    "top_m": "top_m",
}


@dataclass(frozen=True)
class Scored:
    """One replayed setting: its assignment (replayed params only), the objective and
    the largest constraint violation at the solved gates, and what else to tabulate.
    With ``bound`` set, the setting was not scored exactly (``ReplayPlan.search``):
    ``objective`` and ``violation`` are NaN, the best objective its gates reach under the
    constraints is at most ``bound``, and ``-inf`` says no gate setting meets them."""

    assignment: dict[str, Any]
    objective: float
    violation: float
    columns: dict[str, float] = field(default_factory=dict)
    bound: float | None = None

    @property
    def feasible(self) -> bool:
        return constraints_hold([self.violation]) if self.bound is None else self.bound > -math.inf

    @property
    def exact(self) -> bool:
        return self.bound is None


class ReplayPlan:
    """The replayed params of a search space and how to search them (module doc)."""

    def __init__(self, space: Any, config: ReplayConfig, *, where: str = "replay") -> None:
        self.config = config
        self.roles: dict[str, str] = dict(config.params)
        for name, role in self.roles.items():
            if name not in space:
                raise ConfigError(
                    f"{where}.params: {name} is not a param of the search space; name one of "
                    f"{[p.name for p in space.params][:8]}"
                )
            p = space[name]
            if p.spec.post_retrieval:
                raise ConfigError(
                    f"{where}.params: {name} is a post-retrieval gate (solved already); drop it from replay.params"
                )
            kind = p.spec.type
            if kind not in role_kinds(role):
                raise ConfigError(
                    f"{where}.params: {name} is a {kind} param, but role {role} needs "
                    f"{' or '.join(role_kinds(role))}; fix its type or its role"
                )
            if weight_source(role) is not None and not float(p.spec.low) > 0:
                raise ConfigError(
                    f"{where}.params: {name} (role {role}) reaches {p.spec.low}; a source's weight must stay above 0 "
                    "(weight 0 drops its candidates, and engines refuse it): raise its low"
                )
            allowed = ROLE_CHOICES.get(role)
            if allowed is not None and not set(p.spec.choices) <= allowed:
                raise ConfigError(
                    f"{where}.params: {name} offers {sorted(map(str, p.spec.choices))}, but replay "
                    f"models {role} as one of {sorted(allowed)}; drop the others from its choices"
                )
        for p in space.params:
            if p.name not in self.roles and any(c in self.roles for c in p.spec.when):
                raise ConfigError(
                    f"{where}: {p.name} is sampled but depends on replayed "
                    f"{[c for c in p.spec.when if c in self.roles]}; replay it too, or drop the when:"
                )
        self.params = [p for p in space.params if p.name in self.roles]
        self._space = space
        self._declared = {
            name: _checked_grid(space[name], values, f"{where}.grid.{name}")
            for name, values in config.grid.items()
            if _known(name, self.roles, f"{where}.grid")
        }

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.roles)

    def to_solve(self, given: Mapping[str, Any]) -> list[str]:
        """The replayed params a trial with ``given`` (suggested or queued) leaves to solve:
        those not given, less any whose conditions ``given`` settles against it."""
        out = []
        for p in self.params:
            if p.name in given:
                continue
            if all(c in given for c in p.spec.when) and not self._space_active(p.name, given):
                continue
            out.append(p.name)
        return out

    def retrieval_values(self) -> dict[str, Any]:
        """What the explained retrieval is served with: every source of a weights simplex
        at an equal share, so each source returns its candidates (a weight 0 adds none)."""
        out: dict[str, Any] = {}
        for p in self.params:
            if self.roles[p.name] == "weights":  # the only role whose value decides the candidates
                comps = p.spec.components
                out[p.name] = p.spec.decode(_sticks([1.0] * len(comps)))
        return out

    def setting(self, assignment: Mapping[str, Any], served: FusionSetting) -> FusionSetting:
        """``served`` with the replayed params of ``assignment`` put in their roles (a
        ``weight:<source>`` role sets that source's weight, the others keep theirs)."""
        changes: dict[str, Any] = {}
        weights: dict[str, float] | None = None
        for n, v in assignment.items():
            role = self.roles.get(n)
            if role is None:
                continue
            source = weight_source(role)
            if role == "weights" or source is not None:
                weights = dict(served.weights) if weights is None else weights
                weights.update(dict(v) if source is None else {source: float(v)})
            else:
                changes[_FIELD[role]] = v
        if weights is not None:
            changes["weights"] = weights
        return replace(served, **changes)

    def served_by_request(self, document: Mapping[str, Any], fusion: SubscoreFusion) -> FusionSetting:
        """The setting an engine that fuses as ``fusion`` declares serves a request whose
        bound values are ``document`` (tuner.study.trial.request_channel: one config
        document): ``fusion``'s values, with each replayed param's value in the request
        in its role. Every gate is 0 (an engine's plain fusion: tuner.evaluation.subscores)."""
        base = FusionSetting(
            method=fusion.method,
            weights=dict(fusion.weights),
            rrf_k=float(fusion.rrf_k),
            normalization=fusion.normalization,
            plain_sum=fusion.combine == "sum",
        )
        found = self._space.current_assignment([document])
        return self.setting({n: found[n] for n in self.roles if n in found}, base)

    # ---------------------------------------------------------------- the grid

    def values(self, p: Any) -> list[Any]:
        """The grid values of one replayed param (module doc)."""
        if p.name in self._declared:
            return list(self._declared[p.name])
        spec, n = p.spec, self.config.points
        if spec.type == "categorical":
            return list(spec.choices)
        if spec.type == "simplex":
            m = max(1, round(1.0 / self.config.weight_step))
            out = []
            for parts in _compositions(m, len(spec.components)):
                shares = [spec.total * k / m for k in parts]
                head = [round(s, spec.decimals) for s in shares[:-1]]
                out.append(
                    dict(zip(spec.components, [*head, round(spec.total - sum(head), spec.decimals)], strict=True))
                )
            return out
        low, high = float(spec.low), float(spec.high)
        if spec.log:
            grid = np.geomspace(low, high, n)
        elif spec.step:
            count = math.floor((high - low) / spec.step + 1e-9) + 1
            idx = np.arange(count) if count <= n else np.unique(np.round(np.linspace(0, count - 1, n)))
            grid = low + spec.step * idx
        else:
            grid = np.linspace(low, high, n)
        if spec.type == "int":
            return sorted({int(round(v)) for v in grid})  # noqa: RUF046 - numpy 1.x round() gives a float
        return sorted({round(float(v), 10) for v in grid})

    def grid(self, given: Mapping[str, Any], limit: int | None = None) -> list[dict[str, Any]] | None:
        """Every grid setting (conditions honoured against ``given`` too); None when there
        are more than ``limit`` (default ``max_settings``)."""
        limit = self.config.max_settings if limit is None else limit
        settings: list[dict[str, Any]] = [{}]
        for p in self.params:
            if p.name in given:  # queued with a value (a shortlist variant): measured at it
                continue
            grown: list[dict[str, Any]] = []
            for s in settings:
                if self._space_active(p.name, {**given, **s}):
                    grown.extend({**s, p.name: v} for v in self.values(p))
                else:
                    grown.append(s)
                if len(grown) > limit:
                    return None
            settings = grown
        return settings

    def _space_active(self, name: str, assignment: Mapping[str, Any]) -> bool:
        return bool(self._space.active(name, assignment))

    # ---------------------------------------------------------------- search

    def search(
        self,
        score: Callable[[dict[str, Any]], Scored],
        *,
        given: Mapping[str, Any],
        seed: int,
        maximize: bool = True,
        score_many: Callable[[list[dict[str, Any]]], list[Scored]] | None = None,
        bound_many: Callable[[list[dict[str, Any]]], list[Any]] | None = None,
        keep: int = 1,
    ) -> tuple[list[Scored], str]:
        """Score the grid (all at once through ``score_many`` when given), or ``max_settings``
        settings a seeded TPE proposes one by one; returns every setting (in the order
        scored) and how they were chosen, in words.

        With ``bound_many`` (a tuner.study.gates.threshold.GateBound per grid setting, or None) and a
        maximised objective, the grid is bounded first and scored exactly best bound first,
        until the next bound falls below the ``keep``-th best exact score: the ``keep`` best
        are those scoring every setting would give (ties included, grid order breaking them),
        and the others come back with their bound (``Scored.bound``). An exact score above
        its bound, or a feasibility the bound did not see, scores the whole grid instead."""
        grid = self.grid(given)
        if grid is not None:
            many = score_many if score_many is not None else (lambda xs: [score(a) for a in xs])
            note = ""
            if bound_many is not None and maximize and len(grid) > keep:
                found = _bounded(grid, many, bound_many(grid), keep)
                if not isinstance(found, str):
                    exact = sum(s.exact for s in found)
                    return found, (
                        f"grid of {len(grid)}, bounded; {exact} scored exactly, the other "
                        f"{len(grid) - exact} bounded below the best {keep}"
                    )
                note = f" ({found}; every setting scored)"
            return many(grid), f"grid of {len(grid)}{note}"
        sampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=min(20, max(1, self.config.max_settings // 5))
        )
        study = optuna.create_study(direction="maximize" if maximize else "minimize", sampler=sampler)
        seen: dict[str, Scored] = {}
        out: list[Scored] = []
        for _ in range(self.config.max_settings):
            trial = study.ask()
            assignment: dict[str, Any] = {}
            for p in self.params:
                if p.name not in given and self._space_active(p.name, {**given, **assignment}):
                    assignment[p.name] = p.spec.suggest(trial, p.name)
            key = json.dumps(assignment, sort_keys=True, default=str)
            if key not in seen:
                seen[key] = score(assignment)
                out.append(seen[key])
            s = seen[key]
            trial.set_constraint("violation", float(s.violation) if math.isfinite(s.violation) else 1e9)
            study.tell(trial, s.objective if math.isfinite(s.objective) else (-1e9 if maximize else 1e9))
        return out, f"TPE, {self.config.max_settings} proposals (seed {seed}), {len(out)} distinct"


#: settings scored exactly at a time once the ``keep`` best are known (``_bounded``)
_CHUNK = 8


def _bounded(
    grid: list[dict[str, Any]], many: Callable[[list[dict[str, Any]]], list[Scored]], bounds: list[Any], keep: int
) -> list[Scored] | str:
    """``ReplayPlan.search``'s bounded grid: the settings scored exactly (in grid order), then
    the bounded ones; or why the bound cannot be used (then every setting is scored)."""
    if any(b is None for b in bounds):
        return "no bound holds for this objective, constraints or retrieval"
    feasible = [i for i, b in enumerate(bounds) if b.feasible]
    if len(feasible) < keep:
        return f"fewer than {keep} settings meet the constraints"
    order = sorted(feasible, key=lambda i: (-bounds[i].upper, i))
    exact: dict[int, Scored] = {}
    at = 0
    while at < len(order):
        if len(exact) < keep:
            chunk = order[at : at + keep - len(exact)]
        else:
            nth = sorted((s.objective for s in exact.values()), reverse=True)[keep - 1]
            chunk = [i for i in order[at : at + _CHUNK] if bounds[i].upper >= nth]
            if not chunk:
                break
        for i, s in zip(chunk, many([grid[i] for i in chunk]), strict=True):
            if not s.feasible or not s.objective <= bounds[i].upper:
                return (
                    f"setting {i + 1} scored {s.objective:.6f} (violation {s.violation:+.4f}) against a bound "
                    f"of {bounds[i].upper:.6f}, feasible"
                )
            exact[i] = s
        at += len(chunk)
    rest = [i for i in [*order, *range(len(grid))] if i not in exact]  # best bound first, then the infeasible
    # the exact ones in grid order, so that ``ranked`` breaks their ties as over the whole grid
    return [
        *(exact[i] for i in sorted(exact)),
        *(Scored(grid[i], math.nan, math.nan, bound=bounds[i].upper) for i in dict.fromkeys(rest)),
    ]


def ranked(scored: Sequence[Scored], *, maximize: bool = True) -> list[Scored]:
    """Feasible first, then the best objective, the least violation, the order scored; a
    setting without an objective after those with one, bounded ones (``Scored.bound``) after
    every exact one, by bound."""
    sign = -1.0 if maximize else 1.0

    def key(item: tuple[int, Scored]) -> tuple[bool, float, bool, float, int]:
        i, s = item
        if s.bound is not None:
            return (not s.feasible, 0.0 if s.feasible else math.inf, True, sign * s.bound, i)
        objective = s.objective if math.isfinite(s.objective) else math.inf * sign  # the worst
        return (not s.feasible, max(s.violation, 0.0), False, sign * objective, i)

    return [s for _, s in sorted(enumerate(scored), key=key)]


def sweep_frame(scored: Sequence[Scored], order: Sequence[Scored]) -> pd.DataFrame:
    """One row per scored setting, the params flattened (``fusion.weights.bm25``), then
    the objective, the violation, feasibility, the columns and the rank (1 = best)."""
    rank = {id(s): i + 1 for i, s in enumerate(order)}
    rows = []
    for s in scored:
        row: dict[str, Any] = flatten(s.assignment)
        row.update(
            objective=s.objective,
            violation=s.violation,
            feasible=s.feasible,
            exact=s.exact,
            objective_bound=s.bound if s.bound is not None else math.nan,
            **s.columns,
            rank=rank[id(s)],
        )
        rows.append(row)
    return pd.DataFrame(rows).sort_values("rank", kind="stable").reset_index(drop=True)


def _known(name: str, roles: Mapping[str, str], where: str) -> bool:
    if name not in roles:
        raise ConfigError(f"{where}: {name} is not a replayed param; list it under replay.params or drop its grid")
    return True


def _checked_grid(p: Any, values: Sequence[Any], where: str) -> list[Any]:
    """The declared grid values of param ``p``, each checked against its kind and range."""
    spec = p.spec
    if not values:
        raise ConfigError(f"{where}: an empty grid; give at least one value or drop it")
    out: list[Any] = []
    for v in values:
        if spec.type == "categorical":
            if v not in spec.choices:
                raise ConfigError(f"{where}: {v!r} is not one of the choices {list(spec.choices)}")
            out.append(v)
        elif spec.type == "simplex":
            try:
                shares = spec.decode(_sticks(spec._weights(v)))
            except ValueError as exc:
                raise ConfigError(f"{where}: {v!r}: {exc}") from None
            out.append(shares)
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not spec.low <= v <= spec.high:
                raise ConfigError(f"{where}: {v!r} is not a number in [{spec.low}, {spec.high}]")
            if spec.type == "int" and not float(v).is_integer():
                raise ConfigError(f"{where}: {v!r} is not a whole number")
            out.append(int(v) if spec.type == "int" else float(v))
    return _unique(out)


def _unique(values: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(json.dumps(v, sort_keys=True), v)
    return list(seen.values())


def _sticks(shares: Sequence[float]) -> list[float]:
    from tuner.config.space.simplex import shares_to_sticks

    return shares_to_sticks(shares)


def _compositions(m: int, parts: int) -> list[tuple[int, ...]]:
    """Every way of writing ``m`` as an ordered sum of ``parts`` non-negative ints."""
    out = []
    for cuts in itertools.combinations(range(m + parts - 1), parts - 1):
        bounds = (-1, *cuts, m + parts - 1)
        out.append(tuple(bounds[i + 1] - bounds[i] - 1 for i in range(parts)))
    return out
