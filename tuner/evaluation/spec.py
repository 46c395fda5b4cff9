"""How to talk to a search API: declared in config, not code.

These typed models are shared by `tuner eval` and by experiment files (the
`evaluation:` section). Unknown keys are rejected so a typo never passes silently.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationInfo, field_validator

from tuner.errors import ConfigError
from tuner.evaluation.paths import split_path

#: ``deadline_s`` when not given: this many ``timeout_s`` (connect, send, the wait for
#: the first byte and the body each get one timeout_s)
DEADLINE_TIMEOUTS = 4
MIB = 1024 * 1024
#: bounds of ``max_response_bytes``: below 1 KiB no real answer fits; above 1 GiB the cap
#: no longer protects the tuner's memory
MIN_RESPONSE_BYTES = 1024
MAX_RESPONSE_BYTES = 1024 * MIB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestMapping(_Strict):
    """The HTTP request sent for one query.

    ``body`` is a JSON template. A string value that is exactly ``"{name}"`` is
    replaced by the typed value of ``name`` from the query record (``query``,
    ``query_id``, ``top_k`` or any extra field); other strings are formatted with
    ``str.format``. When ``pass_extra`` is true, the query record's extra fields
    (date hints, filters) are merged into the body.
    """

    url: str
    method: Literal["POST", "GET"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] = Field(default_factory=lambda: {"query": "{query}", "top_k": "{top_k}"})
    pass_extra: bool = True
    request_id_header: str = "X-Request-ID"
    #: more header / query / body names whose values are secret (recorded as ***; tuner.secrets)
    secret_fields: tuple[str, ...] = ()


class ResponseMapping(_Strict):
    """Where to find things in the JSON response (dotted paths, e.g. ``data.hits``; a
    dot inside a key escaped with a backslash, ``@search\\.score``: tuner.evaluation.paths)."""

    results_path: str = "results"
    doc_id: str = "doc_id"
    score: str | None = "score"
    title: str | None = "title"
    confidence: str | None = None
    handoff: str | None = None
    #: a text saying why a query was handed off (which config key); the preflight quotes it
    handoff_reason: str | None = None
    fallback_level: str | None = None

    @field_validator(
        "results_path", "doc_id", "score", "title", "confidence", "handoff", "handoff_reason", "fallback_level"
    )
    @classmethod
    def _well_formed(cls, path: str | None) -> str | None:
        # refused when the config is read, not at the first answer of a study
        if path is not None:
            try:
                split_path(path)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return path


class EvalSpec(_Strict):
    """Everything a batch evaluation needs besides the queries and the labels."""

    request: RequestMapping
    response: ResponseMapping = Field(default_factory=ResponseMapping)
    top_k: PositiveInt = 50
    concurrency: PositiveInt = 4
    timeout_s: PositiveFloat = Field(
        default=10.0, description="httpx's timeout: bounds connecting and each single read, not the whole request."
    )
    deadline_s: float | None = Field(
        default=None,
        description="Whole-request deadline of one attempt (connect + send + every read of the body); "
        f"default {DEADLINE_TIMEOUTS} x timeout_s. A backend that drips its answer fails the attempt here.",
    )
    max_response_bytes: int = Field(
        default=16 * MIB,
        description="A response body larger than this fails its query (read no further); default 16 MiB.",
    )
    retries: int = Field(default=3, ge=0, le=10)
    max_failed_queries: float = Field(
        default=0.05,
        ge=0,
        description="Failure budget: a fraction (<1) or an absolute count (>=1) of queries.",
    )
    gains: Literal["linear", "exp"] = "linear"
    backoff_s: PositiveFloat = Field(
        default=0.2, description="First retry wait; doubles per attempt (with jitter) up to backoff_max_s."
    )
    backoff_max_s: PositiveFloat = 5.0
    max_empty_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A trial whose in-scope queries come back with no results above this share fails with "
        "that reason instead of scoring 0 (a broken request or mapping, not a bad config); 1 turns it off.",
    )

    @field_validator("deadline_s")
    @classmethod
    def _deadline_covers_a_timeout(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        timeout = info.data.get("timeout_s")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"deadline_s={value:g}: use a positive number of seconds, or leave it out "
                f"(default {DEADLINE_TIMEOUTS} x timeout_s)"
            )
        if timeout is not None and value < timeout:
            raise ValueError(
                f"deadline_s={value:g} is below timeout_s={timeout:g}: the whole-request deadline "
                "covers connect and every read, so it must be at least timeout_s; raise deadline_s "
                f"or leave it out (default {DEADLINE_TIMEOUTS} x timeout_s)"
            )
        return value

    @field_validator("max_response_bytes")
    @classmethod
    def _cap_is_sane(cls, value: int) -> int:
        if not MIN_RESPONSE_BYTES <= value <= MAX_RESPONSE_BYTES:
            raise ValueError(
                f"max_response_bytes={value}: use a byte count from {MIN_RESPONSE_BYTES} (1 KiB) "
                f"to {MAX_RESPONSE_BYTES} (1 GiB), e.g. {16 * MIB} (16 MiB, the default)"
            )
        return value

    @field_validator("max_failed_queries")
    @classmethod
    def _count_is_whole(cls, value: float) -> float:
        if value >= 1 and not float(value).is_integer():
            raise ValueError(
                f"max_failed_queries={value}: use a fraction below 1 (e.g. 0.05) or a whole count (e.g. 3)"
            )
        return value

    @property
    def request_deadline_s(self) -> float:
        """The whole-request deadline of one attempt: ``deadline_s``, or
        ``DEADLINE_TIMEOUTS x timeout_s`` when not set."""
        return self.deadline_s if self.deadline_s is not None else DEADLINE_TIMEOUTS * self.timeout_s

    @property
    def query_bound_s(self) -> float:
        """The longest one query can take once it is sent (its wait for a concurrency
        slot aside): every attempt at its deadline, every backoff at its maximum."""
        return (self.retries + 1) * self.request_deadline_s + self.retries * self.backoff_max_s

    def allowed_failures(self, n_queries: int) -> int:
        """How many of ``n_queries`` may fail before the batch fails as a whole."""
        if self.max_failed_queries >= 1:
            return int(self.max_failed_queries)
        # floor: a 5% budget on 10 queries allows none; the epsilon absorbs 0.1*30 = 3.0000000000000004
        return math.floor(self.max_failed_queries * n_queries + 1e-9)
