"""Gain schemes: how a relevance grade turns into the gain a metric adds up.

``linear`` uses the grade itself (Fully=3, Mostly=2, Weakly=1, Irrelevant=0): this is
what trec_eval's ``ndcg`` does, so linear NDCG can be checked against it.
``exp`` uses 2^g - 1, which rewards the top grade more strongly (Burges et al.).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tuner.errors import InputError

_SCHEMES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "linear": lambda grades: grades,
    "exp": lambda grades: np.exp2(grades) - 1.0,
}

GAIN_SCHEMES: tuple[str, ...] = tuple(_SCHEMES)


def check_gain_scheme(scheme: str) -> str:
    """Return ``scheme`` when it is known, else raise InputError naming the choices."""
    if scheme not in _SCHEMES:
        raise InputError(f"unknown gain scheme {scheme!r}; use one of: {', '.join(GAIN_SCHEMES)}")
    return scheme


def gain_table(scheme: str, max_grade: int) -> np.ndarray:
    """Gain of every grade 0..max_grade as a float lookup table (index = grade)."""
    check_gain_scheme(scheme)
    return _SCHEMES[scheme](np.arange(max_grade + 1, dtype=np.float64))
