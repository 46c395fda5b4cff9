"""Regression gates for CI: ``Primary_Metric_Score>=0.6``, ``OOS_FP_Rate<=0.1``.

``--fail-under NAME=VALUE`` misses when the metric is below VALUE; ``--fail-over``
when it is above. Pure: parse, then check against a scorecard.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from tuner.errors import InputError

GateKind = Literal["under", "over"]


@dataclass(frozen=True, slots=True)
class Gate:
    metric: str
    kind: GateKind
    threshold: float

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.kind == 'under' else '<='} {self.threshold:g}"


@dataclass(frozen=True, slots=True)
class GateMiss:
    gate: Gate
    value: float

    def message(self) -> str:
        shown = "undefined" if math.isnan(self.value) else f"{self.value:.4f}"
        word = "below" if self.gate.kind == "under" else "above"
        return (
            f"gate missed: {self.gate.metric} = {shown} is {word} {self.gate.threshold:g} "
            f"(required {self.gate.describe()})"
        )


def parse_gate(text: str, kind: GateKind) -> Gate:
    """``"Primary_Metric_Score=0.6"`` -> Gate; InputError with the fix otherwise."""
    name, sep, value = text.partition("=")
    flag = f"--fail-{kind}"
    if not sep or not name.strip():
        raise InputError(f"{flag} {text!r}: write METRIC=VALUE, e.g. {flag} Primary_Metric_Score=0.6")
    try:
        threshold = float(value)
    except ValueError:
        raise InputError(f"{flag} {text!r}: {value!r} is not a number; write METRIC=VALUE") from None
    return Gate(name.strip(), kind, threshold)


def check_gates(metrics: Mapping[str, float], gates: Iterable[Gate]) -> list[GateMiss]:
    """The gates the scorecard misses (an undefined value misses). InputError for an
    unknown metric name, listing the known ones, so a typo cannot pass a gate."""
    misses: list[GateMiss] = []
    for gate in gates:
        if gate.metric not in metrics:
            known = ", ".join(sorted(metrics))
            raise InputError(f"gate {gate.describe()}: unknown metric {gate.metric!r}; known metrics: {known}")
        value = float(metrics[gate.metric])
        bad = math.isnan(value) or (value < gate.threshold if gate.kind == "under" else value > gate.threshold)
        if bad:
            misses.append(GateMiss(gate, value))
    return misses
