"""The parameter-kind interface: the keys every ``params:`` entry shares, and what each
kind (one class per ``type:``) must say about itself.

A kind validates its own keys (pydantic), names the Optuna params that encode it and
their distributions, decodes what the trial suggests into the value written to the
config, encodes such a value back (for ``enqueue_trial``), reads the config's current
value, and explains why a config value does not fit. Adding a kind is adding one
subclass and listing it in :data:`tuner.config.space.params.Param`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import optuna
from optuna.distributions import BaseDistribution
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.config.space.distributions import suggest_one
from tuner.config.space.gates import GateRole
from tuner.config.space.values import Scalar, same

#: Between a config key and the part of its value a sampler coordinate encodes
#: (``fusion.weights:bm25``, ``fallback.windows_days:gap1``). Config keys are dotted paths,
#: so a param name holding it is a coordinate: the samplers' own, never shown to people
#: (tuner.study.storage.user_view serves the config keys instead).
COORDINATE_SEP = ":"


def coordinate(key: str, part: str) -> str:
    """The Optuna param name of the coordinate ``part`` of config key ``key``."""
    return f"{key}{COORDINATE_SEP}{part}"


def is_coordinate(name: str) -> bool:
    """Whether the Optuna param ``name`` is a sampler coordinate, not a config key."""
    return COORDINATE_SEP in name


def check_bounds(low: float, high: float, log: bool, step: float | None) -> None:
    """ValueError (a fix included) when ``low..high`` cannot be sampled as declared."""
    if low > high:
        raise ValueError(f"inverted bounds low={low} > high={high}, swap them")
    if log and low <= 0:
        raise ValueError(f"log scale needs low > 0, got low={low} (raise low or drop log)")
    if log and step is not None and step != 1:
        raise ValueError(f"log scale cannot be combined with step={step} (drop one of them)")


class ParamKind(BaseModel):
    """One ``params:`` entry; subclasses add ``type: Literal[...]`` and their own keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(default=None, description="Dotted config path; default: the param's name.")
    file: int | str | None = Field(default=None, description="Config file index or path; default: the space's file.")
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    post_retrieval: bool = Field(
        default=False,
        description="Only gates results after retrieval: solved per trial from one retrieval, not sampled.",
    )
    gate: GateRole | None = Field(default=None, description="A post-retrieval gate's role; implies post_retrieval.")

    #: Sampled by Optuna and part of the baseline (False: a value the space fixes).
    tuned: ClassVar[bool] = True
    #: Other params may name it in ``when:`` (a scalar; a group is no condition).
    conditionable: ClassVar[bool] = True
    #: May be a post-retrieval gate, solved from one retrieval (a float only).
    gateable: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _gate_implies_post_retrieval(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gate") is not None:
            if data.get("post_retrieval") is False:
                raise ValueError("gate: implies post_retrieval: true; drop post_retrieval: false")
            data = {**data, "post_retrieval": True}
        return data

    # ---- sampling

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        """The Optuna params encoding param ``name``, in suggestion order."""
        raise NotImplementedError

    def decode(self, raw: Sequence[Any]) -> Any:
        """The config value from the suggested Optuna values (in :meth:`distributions` order)."""
        raise NotImplementedError

    def suggest(self, trial: optuna.trial.BaseTrial, name: str) -> Any:
        """Ask ``trial`` for every Optuna param of ``name``, in order, and decode them."""
        return self.decode([suggest_one(trial, n, d) for n, d in self.distributions(name).items()])

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        """Config value -> the Optuna params :meth:`suggest` turns back into it; ValueError
        with the reason when the value cannot be represented."""
        raise NotImplementedError

    # ---- the target's config

    def from_config(self, value: Any) -> Any:
        """The config's current value as an assignment value (the baseline)."""
        if isinstance(value, bool | str):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        return value

    def as_found(self, value: Any, found: Any) -> Any:
        """``found`` (the config's value, from :meth:`from_config`) when ``value`` leaves it
        unchanged, else ``value``: a trial that keeps a key carries, and writes, the
        file's own value, never a re-rendered one."""
        return found if _same_value(value, found) else value

    def to_config(self, value: Any) -> Any:
        """An assignment value as the config file writes it (most kinds: as it is)."""
        return value

    def type_problem(self, value: Any) -> str | None:
        """Why the config's ``value`` cannot take this param's values, or None."""
        return None

    def range_warning(self, value: Any) -> str | None:
        """Why the config's ``value`` lies outside the space (a warning), or None."""
        return None

    def condition_problem(self, value: Any) -> str | None:
        """Why a ``when:`` naming this param can never hold ``value``, or None."""
        return None


def _same_value(a: Any, b: Any) -> bool:
    """Config values equal as written: scalars by `same`, lists and mappings item by item."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return same(a, b)
