"""Gate roles: the vocabulary of ``gate:`` (which post-retrieval filter a param is).

A gate only filters what one retrieval returned, so tuner.study.gates.threshold solves it per
trial instead of sampling it. The role, not the key, says how: a backend may call its
confidence gate ``rag.min_confidence``.
"""

from __future__ import annotations

from typing import Literal

#: ``confidence``: hand a query off when the response's confidence < value;
#: ``min_score``: drop results scoring < value (an emptied list is handed off).
GateRole = Literal["confidence", "min_score"]
GATE_ROLES: tuple[str, ...] = ("confidence", "min_score")
#: The reference backend's gate keys: spaces written before ``gate:`` existed name no role.
REFERENCE_GATES: dict[str, str] = {"confidence.threshold": "confidence", "citation.min_score": "min_score"}
