"""The ``workers:`` section: how `tuner worker` replicas share one study."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError


class WorkerSettings(StrictModel):
    """The ``workers:`` section: how `tuner worker` replicas share one study.

    Replica N gets its own copy of the config files, its own state dir, its own port
    (``ports``) and, for docker targets, its own compose project (``replica_name``).
    `tuner workers --count` overrides ``count``; `tuner worker` overrides
    ``heartbeat_interval_s`` (``--heartbeat``), ``grace_period_s`` (``--grace``),
    ``max_retry`` (``--max-retry``) and ``ports`` (``--port``, this replica's port);
    ``replica_name`` has no command-line override.
    """

    count: PositiveInt = Field(1, description="replicas `tuner workers` starts on this machine")
    ports: Literal["auto"] | PositiveInt | list[PositiveInt] = Field(
        "auto", description="replica N's port: auto (a free one), BASE + N, or the N-th of a list"
    )
    replica_name: str = Field(
        "{name}-r{replica}",
        description=(
            "replica N's compose project (docker targets); {name}: target.docker.project (else the compose "
            "project name), {replica}: N"
        ),
    )
    heartbeat_interval_s: int = Field(30, ge=1, description="how often a running trial proves its worker is alive")
    grace_period_s: int | None = Field(
        None, ge=1, description="a trial silent this long is failed and retried (default: 4 x heartbeat_interval_s)"
    )
    max_retry: int = Field(2, ge=0, description="retries of one crashed trial before it stays failed")

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if self.grace_period_s is not None and self.grace_period_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"grace_period_s ({self.grace_period_s}) must exceed heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or live trials would be failed between two heartbeats"
            )
        if isinstance(self.ports, list) and len(set(self.ports)) != len(self.ports):
            raise ValueError(f"ports {self.ports}: each replica needs its own port")
        if "{replica}" not in self.replica_name:
            raise ValueError(f"replica_name {self.replica_name!r} has no {{replica}}: replicas would share a project")
        return self

    @property
    def grace(self) -> int:
        return self.grace_period_s or 4 * self.heartbeat_interval_s

    def port_for(self, replica: int) -> int | None:
        """Replica ``replica``'s port; None for ``auto`` (pick a free one)."""
        if self.ports == "auto":
            return None
        if isinstance(self.ports, int):
            return self.ports + replica
        if replica >= len(self.ports):
            raise ConfigError(f"workers.ports lists {len(self.ports)} ports; replica {replica} has none: add one")
        return self.ports[replica]
