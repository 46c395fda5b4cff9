"""The parameter kinds a space file may use (the ``type:`` union) and :class:`ParamSpec`,
one parameter of a loaded space with its config location resolved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Union

from pydantic import Field

from tuner.config.space.gates import REFERENCE_GATES
from tuner.config.space.kind import ParamKind
from tuner.config.space.ordered import OrderedParam
from tuner.config.space.scalars import (
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
)
from tuner.config.space.simplex import SimplexParam

#: One ``params:`` entry, its class chosen by ``type:`` (a new kind is listed here).
Param = Annotated[
    Union[FloatParam, IntParam, CategoricalParam, FixedParam, SimplexParam, OrderedParam],  # noqa: UP007
    Field(discriminator="type"),
]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a loaded space, its config location resolved."""

    name: str
    path: str
    file: int
    spec: ParamKind
    line: int | None

    @property
    def kind(self) -> str:
        return self.spec.type  # type: ignore[attr-defined]  # every kind declares its type tag

    @property
    def gate(self) -> str | None:
        """A post-retrieval param's role: declared with ``gate:``, else the reference key's own."""
        if not self.spec.post_retrieval:
            return None
        return self.spec.gate or REFERENCE_GATES.get(self.path)
