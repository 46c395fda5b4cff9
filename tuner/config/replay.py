"""The experiment's ``replay:`` section: fusion params solved from one explained retrieval.

Fusion weights, the RRF k, the score normalisation, the recency boost and the
confidence's ``top_m`` only recombine the candidate lists each source returns; they do
not change which candidates those are. A backend that can explain a search (its
per-source candidate lists, per date tier, tuner.evaluation.fusion_replay) lets every
trial retrieve once and score many such settings client-side, exactly, the way the
post-retrieval gates are solved. ``params`` ties search-space params to the roles of
the replay model; those params are then not sampled by the study but searched inside
each trial, and the best ``verify_top`` settings are served and measured live.

::

    replay:
      params:                       # search-space param -> role in the fusion model
        fusion.method: method
        fusion.rrf_k: rrf_k
        fusion.weights: weights
        fusion.normalization: normalization
      request: {explain: true}      # merged into the request body of the explained retrieval
      explain: explain              # where the response holds the explanation
      max_settings: 400             # the whole grid when it has at most this many settings,
      points: 12                    #   else this many settings from a seeded optimiser
      weight_step: 0.05             # grid step of a weights simplex
      grid: {fusion.rrf_k: [1, 2, 5, 10, 20, 60]}   # or the values, declared
      verify_top: 2                 # best replayed settings measured live per trial
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from tuner.config.strict import StrictModel

#: the fusion model's roles (tuner.evaluation.fusion_replay.FusionSetting fields)
Role = Literal["method", "rrf_k", "weights", "normalization", "recency_weight", "recency_half_life_days", "top_m"]
ROLES: tuple[str, ...] = get_args(Role)
#: the kind of search-space param each role takes
ROLE_KINDS: dict[str, tuple[str, ...]] = {
    "method": ("categorical",),
    "normalization": ("categorical",),
    "weights": ("simplex",),
    "rrf_k": ("int", "float"),
    "recency_weight": ("float", "int"),
    "recency_half_life_days": ("int", "float"),
    "top_m": ("int",),
}
#: the values a categorical role may take
ROLE_CHOICES: dict[str, frozenset[str]] = {
    "method": frozenset({"rrf", "linear"}),
    "normalization": frozenset({"minmax", "z"}),
}


class ReplayConfig(StrictModel):
    """``replay:``: which params are solved from one explained retrieval, and how."""

    params: dict[str, Role] = Field(
        min_length=1,
        description=(
            "Search-space param -> its role in the fusion model; these params are searched inside each trial "
            "from one explained retrieval instead of being sampled."
        ),
    )
    request: dict[str, Any] = Field(
        default_factory=lambda: {"explain": True},
        description=("Fields merged into the request body of the explained retrieval."),
    )
    explain: str = Field(
        default="explain", min_length=1, description="Dotted path of the explanation in the search response."
    )
    max_settings: int = Field(
        default=400,
        ge=1,
        le=100_000,
        description=(
            "The whole grid is scored when it has at most this many settings; else this many, from a seeded optimiser."
        ),
    )
    points: int = Field(
        default=12, ge=2, le=1000, description="Grid points of a numeric param's range (a log range: geometric)."
    )
    weight_step: float = Field(default=0.05, gt=0, le=0.5, description="Grid step of a weights simplex.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description=("Explicit grid values of a replayed param (name -> list), instead of points / weight_step."),
    )
    verify_top: int = Field(
        default=1,
        ge=1,
        le=20,
        description=(
            "The best replayed settings served and measured live in every trial (the trial reports the best live "
            "one); more than 1 checks the model at more settings, one live batch each."
        ),
    )
    workers: int | str = Field(
        default="auto",
        description=(
            "Helper processes scoring settings beside the tuner's own: a number, or auto (one fewer than the cores, "
            "at most 7); 0: in process only."
        ),
    )
    bound: bool = Field(
        default=True,
        description=(
            "Bound every grid setting first and score exactly only those whose bound reaches the verify_top best "
            "(the same best settings, a fraction of the cost); false: score every setting exactly, so the sweep "
            "shows each one's objective."
        ),
    )

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if v == "auto" or (isinstance(v, int) and 0 <= v <= 64):
            return v
        raise ValueError(f"workers: {v!r}; give a number from 0 to 64, or auto")

    tolerance: float = Field(
        default=1e-9,
        ge=0,
        le=1e-3,
        description=("Largest difference allowed between a replayed and a live objective or constraint value."),
    )

    @field_validator("params")
    @classmethod
    def _one_param_per_role(cls, v: dict[str, str]) -> dict[str, str]:
        seen: dict[str, str] = {}
        for name, role in v.items():
            if role in seen:
                raise ValueError(f"{seen[role]} and {name} both have role {role}; give each role one param")
            seen[role] = name
        return v
