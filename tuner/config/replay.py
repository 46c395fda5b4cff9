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

An engine that explains no candidate lists but returns each hit's sub-scores per source
(Azure AI Search's ``@search.documentDebugInfo``) is replayed from those instead
(``subscores:``, target.channel: request only; tuner.evaluation.subscores)::

    replay:
      params: {fusion.weights.dense: weight:dense}   # a scalar: that source's weight
      request: {debug: vector, top: 1000}            # sub-scores, and every candidate listed
      subscores:
        limit: top                  # the body field that caps the explained answer
        sources:                    # per source, read from each hit: its score and/or rank
          text: {score: '@search\\.documentDebugInfo.vectors.subscores.text.searchScore'}
          dense: {score: '@search\\.documentDebugInfo.vectors.subscores.vectors.0.dense.searchScore'}
        fusion: {method: rrf, rrf_k: 60, combine: sum}   # how the engine fuses them
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError
from tuner.evaluation.paths import split_path

#: the fusion model's roles (tuner.evaluation.fusion_replay.FusionSetting fields)
Role = Literal["method", "rrf_k", "weights", "normalization", "recency_weight", "recency_half_life_days", "top_m"]
ROLES: tuple[str, ...] = get_args(Role)
#: ``weight:<source>``: a scalar param that is one source's weight (the others keep theirs)
WEIGHT_ROLE = "weight:"
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


def role_kinds(role: str) -> tuple[str, ...]:
    """The kinds of search-space param ``role`` takes."""
    return ("float", "int") if role.startswith(WEIGHT_ROLE) else ROLE_KINDS[role]


def weight_source(role: str) -> str | None:
    """The source a ``weight:<source>`` role weighs (None for any other role)."""
    return role[len(WEIGHT_ROLE) :] if role.startswith(WEIGHT_ROLE) else None


def _response_path(v: str | None) -> str | None:
    if v is not None:
        try:
            split_path(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return v


class SubscoreSource(StrictModel):
    """Where a hit holds one source's sub-score and / or rank (response paths, relative
    to the hit, escapes as tuner.evaluation.paths). A hit without it is not in that
    source's list, as the engine fuses it."""

    score: str | None = Field(default=None, min_length=1, description="Path of the source's score in a hit.")
    rank: str | None = Field(default=None, min_length=1, description="Path of the source's rank (1 = first).")

    _paths = field_validator("score", "rank")(_response_path)

    @model_validator(mode="after")
    def _one(self) -> SubscoreSource:
        if self.score is None and self.rank is None:
            raise ValueError("give score: (the path of its sub-score in a hit) or rank:, or both")
        return self


class SubscoreFusion(StrictModel):
    """How the engine fuses the sources, at the values it serves when no replayed param
    sets them (the served setting of the explained retrieval)."""

    method: Literal["rrf", "linear"] = Field(default="rrf", description="rrf: by ranks; linear: normalised scores.")
    rrf_k: float = Field(default=60.0, gt=0, description="The RRF constant (Azure: 60, not a parameter there).")
    normalization: Literal["minmax", "z"] = Field(default="minmax", description="linear: each source's normaliser.")
    combine: Literal["sum", "mean"] = Field(
        default="sum",
        description=(
            "sum: the fused score is the plain weighted sum (Azure, Elasticsearch); mean: divided by the weights' "
            "sum (and, for RRF, scaled so the best possible score is 1, as the reference backend's /search)."
        ),
    )
    weights: dict[str, float] = Field(
        default_factory=dict, description="A source's weight when no replayed param sets it (default 1.0)."
    )


class SubscoreConfig(StrictModel):
    """``replay.subscores``: the explained retrieval read from each hit's sub-scores."""

    sources: dict[str, SubscoreSource] = Field(
        min_length=1, description="Source name -> where a hit holds its sub-score and / or rank."
    )
    fusion: SubscoreFusion = Field(default_factory=SubscoreFusion)
    limit: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Dotted path, in the explained request's body, of the value that caps its answer (Azure: top): an "
            "answer that long may have cut candidates, and fails the explained retrieval."
        ),
    )

    @field_validator("fusion")
    @classmethod
    def _fixed_weights(cls, v: SubscoreFusion) -> SubscoreFusion:
        bad = {k: w for k, w in v.weights.items() if not w > 0}
        if bad:
            raise ValueError(f"fusion.weights {bad}: a weight must be above 0 (a source of weight 0 adds nothing)")
        return v

    @model_validator(mode="after")
    def _known_sources(self) -> SubscoreConfig:
        unknown = sorted(set(self.fusion.weights) - set(self.sources))
        if unknown:
            raise ValueError(f"fusion.weights names {unknown}, not among sources {sorted(self.sources)}")
        if self.fusion.method == "linear":
            no_score = sorted(n for n, s in self.sources.items() if s.score is None)
            if no_score:
                raise ValueError(
                    f"fusion.method linear fuses scores, but sources {no_score} give a rank only; add score:"
                )
        return self


class ReplayConfig(StrictModel):
    """``replay:``: which params are solved from one explained retrieval, and how."""

    params: dict[str, str] = Field(
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
    subscores: SubscoreConfig | None = Field(
        default=None,
        description=(
            "Read the explained retrieval from each hit's per-source sub-scores (an engine's debug output) "
            "instead of the reference backend's explain lists (target.channel: request)."
        ),
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
            if role not in ROLES and not (role.startswith(WEIGHT_ROLE) and weight_source(role)):
                raise ValueError(
                    f"{name}: role {role!r} is not one of {list(ROLES)} nor weight:<source> (one source's weight)"
                )
            if role in seen:
                raise ValueError(f"{seen[role]} and {name} both have role {role}; give each role one param")
            seen[role] = name
        return v

    @model_validator(mode="after")
    def _subscores(self) -> ReplayConfig:
        sub = self.subscores
        if sub is None:
            return self
        if "request" not in self.model_fields_set:
            raise ValueError(
                "subscores needs request: the fields that make the engine answer with its sub-scores and list "
                "every candidate (Azure: {debug: vector, top: 1000})"
            )
        roles = set(self.params.values())
        for name, role in self.params.items():
            source = weight_source(role)
            if source is not None and source not in sub.sources:
                raise ValueError(
                    f"{name}: role {role} weighs {source!r}, not among subscores.sources {sorted(sub.sources)}; "
                    "name one of them"
                )
        if "method" in roles or "normalization" in roles:
            no_score = sorted(n for n, s in sub.sources.items() if s.score is None)
            if no_score:
                raise ValueError(
                    f"a replayed method / normalization may fuse scores, but subscores.sources {no_score} give a "
                    "rank only; add score:"
                )
        return self
