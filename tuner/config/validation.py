"""How a study checks that its gain is real: the ``validation:`` key and the ``cv:`` section.

- ``validation: holdout``: the seeded tune/holdout split (the ``holdout:`` section), the
  best trial measured once more on the held-out queries at the end (tuner.ops.validate);
- ``validation: cv``: every query is tuned on; the selection is cross-validated from the
  per-query scores the trials recorded (tuner.study.crossval), no extra measurement;
- ``validation: both``: the holdout split, and the cross-validation on the tune part.

Left out, it follows ``holdout.enabled``: ``both`` with a holdout, ``cv`` without, so every
study gets the cross-validated estimate unless ``validation: holdout`` turns it off.

::

    validation: both
    cv: {folds: 5, seed: 0, confidence: 0.95}
    selection: best        # or robust: the setting whose neighbourhood scores best

``selection`` is the cross-validated estimate's pick rule (tuner.study.crossval); both
rules are cross-validated and shown side by side whatever it says.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tuner.config.strict import StrictModel

Validation = Literal["holdout", "cv", "both"]
# the pick rule of the cross-validated estimate (tuner.study.crossval, module doc)
Selection = Literal["best", "robust"]


class CrossValConfig(StrictModel):
    """The ``cv:`` section: the folds of the cross-validated estimate."""

    folds: int = Field(5, ge=2, le=20, description="folds the tuned queries are dealt into (stratified by type, scope)")
    seed: int = Field(0, description="which queries share a fold; keep it fixed to compare runs")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="level of the gain's paired bootstrap interval")
