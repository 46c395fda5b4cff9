"""The load-time checks across a space's params: ``when:`` conditions name scalar params
(with values they can take) and form no cycle, which also fixes the suggestion order;
post-retrieval gates are floats, one per role."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.config.space.params import ParamSpec
from tuner.config.yamlfile import did_you_mean
from tuner.errors import ConfigError
from tuner.files import display_path


def _where(path: Path, p: ParamSpec) -> str:
    return display_path(path) + (f":{p.line}" if p.line else "")


def check_conditions(path: Path, specs: Sequence[ParamSpec]) -> None:
    """Every ``when:`` names a scalar param or fixed key of the space, with a value it can take."""
    by_name = {p.name: p for p in specs}
    for p in specs:
        where = _where(path, p)
        for cond, allowed in p.spec.when.items():
            other = by_name.get(cond)
            if other is None:
                raise ConfigError(
                    f"{where}: {p.name}: when: {cond} is not a parameter of this space"
                    f"{did_you_mean(cond, by_name)} (conditions name params or fixed keys)"
                )
            if not other.spec.conditionable:
                raise ConfigError(f"{where}: {p.name}: when: {cond} is a {other.kind} group (condition on a scalar)")
            for value in allowed if isinstance(allowed, list) else [allowed]:
                problem = other.spec.condition_problem(value)
                if problem:
                    raise ConfigError(f"{where}: {p.name}: when: {cond}: {problem}")


def check_gates(source: Path, specs: Sequence[ParamSpec]) -> None:
    """Every post-retrieval param is a float gate with a known role, one param per role."""
    seen: dict[str, str] = {}
    for p in specs:
        if not p.spec.post_retrieval:
            continue
        where = _where(source, p)
        if not p.spec.gateable:
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


def condition_order(source: Path, params: Mapping[str, ParamSpec]) -> list[str]:
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
