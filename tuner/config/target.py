"""The ``target:`` section: the backend's config files and how a patched config is applied
(a process, a compose service, or nothing) and health-checked."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, model_validator

from tuner.config.strict import StrictModel


class ProcessConfig(StrictModel):
    """A local command the tuner starts and restarts.

    Placeholders in ``command`` and ``env`` values: ``{config}`` (first config file),
    ``{config0}``, ``{config1}``..., ``{port}``, ``{python}`` (the tuner's interpreter),
    ``{state_dir}``.
    """

    command: list[str] = Field(min_length=1)
    cwd: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)
    stop_timeout_s: PositiveFloat = 10.0
    log_file: Path | None = None


class DockerConfig(StrictModel):
    """A compose service whose containers are restarted."""

    service: str
    project: str | None = None
    compose_files: list[Path] = Field(default_factory=list)
    stop_timeout_s: PositiveFloat = 10.0
    wait_container_health: bool = Field(
        default=True, description="After a restart, wait for the containers' own healthcheck (when they have one)."
    )
    health_deadline_s: PositiveFloat = 120.0
    replica_env: dict[str, str] = Field(default_factory=dict, description=(
        "tuner worker replicas: extra variables passed to compose (e.g. BACKEND_CONFIG: '{config}', "
        "BACKEND_PORT: '{port}'); placeholders {config} {config0}.. {port} {replica} {project} {state_dir}. "
        "TUNER_REPLICA_CONFIG/_PORT/TUNER_REPLICA/TUNER_REPLICA_PROJECT are always passed."))


class NoneConfig(StrictModel):
    """The backend watches its config and reloads by itself."""

    settle_s: float = Field(default=0.0, ge=0, description="Pause after patching before the health wait.")


class HealthConfig(StrictModel):
    url: str
    deadline_s: PositiveFloat = 60.0
    interval_s: PositiveFloat = 0.2
    fingerprint: str | None = Field(
        default=None,
        pattern=r"^[^.\s]+(\.[^.\s]+)*$",
        description="Dotted field of the health JSON holding the fingerprint of the data the backend loaded; "
        "part of the result-cache key.",
    )


class TargetConfig(StrictModel):
    config_files: list[Path] = Field(min_length=1)
    inputs: list[str] = Field(
        default_factory=list,
        description="Data files the backend serves (paths, globs or directories); their content is part of "
        "the result-cache key.",
    )
    apply: Literal["process", "docker", "none"] = "process"
    port: int | Literal["auto"] | None = Field(default=None, description="Fills {port}; 'auto' picks a free port.")
    process: ProcessConfig | None = None
    docker: DockerConfig | None = None
    none: NoneConfig = Field(default_factory=NoneConfig)
    health: HealthConfig

    @model_validator(mode="after")
    def _section_for_apply(self) -> "TargetConfig":
        if self.apply == "process" and self.process is None:
            raise ValueError("apply: process needs a process: section with a command")
        if self.apply == "docker" and self.docker is None:
            raise ValueError("apply: docker needs a docker: section with the compose service")
        return self
