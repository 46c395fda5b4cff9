"""The ``target:`` section: the backend's config files and how a patched config is applied
(a process, a compose service, or nothing), reloaded without a restart when the backend
can (``reload:``), and health-checked."""

from __future__ import annotations

import signal as _signal
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, field_validator, model_validator

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
    replica_env: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "tuner worker replicas: extra variables passed to compose (e.g. BACKEND_CONFIG: '{config}', "
            "BACKEND_PORT: '{port}'); placeholders {config} {config0}.. {port} {replica} {project} {state_dir}. "
            "TUNER_REPLICA_CONFIG/_PORT/TUNER_REPLICA/TUNER_REPLICA_PROJECT are always passed."
        ),
    )


class NoneConfig(StrictModel):
    """The backend watches its config and reloads by itself."""

    settle_s: float = Field(default=0.0, ge=0, description="Pause after patching before the health wait.")


class HealthConfig(StrictModel):
    url: str
    headers: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Sent with every health GET, for an engine that answers health only with a key (Azure's api-key, a "
            "secured Elasticsearch's Authorization); ${ENV} expanded, every value treated as a secret (redacted)."
        ),
    )
    deadline_s: PositiveFloat = 60.0
    interval_s: PositiveFloat = 0.2
    fingerprint: str | None = Field(
        default=None,
        pattern=r"^[^.\s]+(\.[^.\s]+)*$",
        description="Dotted field of the health JSON holding the fingerprint of the data the backend loaded; "
        "part of the result-cache key.",
    )


class ReloadHttpConfig(StrictModel):
    """The backend's reload endpoint; ``{port}`` is filled like the health URL's."""

    url: str
    method: Literal["POST", "PUT", "PATCH", "GET"] = "POST"
    headers: dict[str, str] = Field(
        default_factory=dict, description="Sent with the reload call; ${ENV} expanded, every value redacted."
    )
    timeout_s: PositiveFloat = 30.0


_DOTTED = r"^[^.\s]+(\.[^.\s]+)*$"


class ReloadConfig(StrictModel):
    """How the backend takes a new config without a restart, and how to confirm it took
    (tuner.targets.reload). Absent: every trial restarts the backend."""

    http: ReloadHttpConfig | None = Field(default=None, description="Reload by an HTTP call.")
    signal: str | None = Field(
        default=None,
        description="Reload by a signal (SIGHUP) sent to the backend process "
        "or, for apply: docker, to every container of the service.",
    )
    fingerprint: str | None = Field(
        default=None,
        pattern=_DOTTED,
        description=(
            "Required: dotted field of the health JSON holding the sha256 (hex) of the config file the backend serves."
        ),
    )
    fingerprint_file: int = Field(default=0, ge=0, description="Index into config_files of that file.")
    restart_keys: list[str] = Field(
        default_factory=list,
        description=(
            "Dotted config paths ('*' matches one segment), matched in every config file: a change under one of "
            "them restarts the backend instead."
        ),
    )
    confirm_deadline_s: PositiveFloat = 10.0

    @field_validator("signal")
    @classmethod
    def _signal_name(cls, v: str | None) -> str | None:
        if v is None:
            return None
        name = v.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name not in _signal.Signals.__members__ or name.startswith("SIG_"):
            raise ValueError(f"unknown signal {v!r}; name one such as SIGHUP or SIGUSR1")
        return name

    @field_validator("restart_keys")
    @classmethod
    def _dotted_keys(cls, v: list[str]) -> list[str]:
        for key in v:
            if not key or any(not seg.strip() for seg in key.split(".")):
                raise ValueError(f"restart key {key!r} is not a dotted path (e.g. sources.*.k1)")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> ReloadConfig:
        if self.http is None and self.signal is None:
            raise ValueError(
                "give how the backend reloads: http: {url: ...} or signal: SIGHUP "
                "(or remove target.reload to restart every trial)"
            )
        if self.http is not None and self.signal is not None:
            raise ValueError("give either http or signal, not both (remove one)")
        if self.fingerprint is None:
            raise ValueError(
                "give fingerprint: the dotted field of the health JSON holding the sha256 of the "
                "config file the backend serves (e.g. fingerprint: config_fingerprint); "
                "a reload is confirmed by it"
            )
        return self


class ApplyToConfig(StrictModel):
    """``request.apply_to``: the file the calling application reads its request values
    from, where `tuner apply` writes the winning values (tuner.ops.apply)."""

    file: Path = Field(description="The application's config file (YAML, JSON or TOML, by its suffix).")
    # "paths", not "keys": a key named "keys" holds secrets by tuner.secrets' naming rule
    paths: dict[str, str] = Field(
        min_length=1,
        description="Every bound config key -> the dotted path in that file holding its value "
        "(a number indexes a list).",
    )

    @field_validator("file")
    @classmethod
    def _known_format(cls, file: Path) -> Path:
        from tuner.config.formats import check_suffix

        problem = check_suffix(file)
        if problem is not None:
            raise ValueError(problem.replace("point config_files at one", "point apply_to.file at one"))
        return file

    @field_validator("paths")
    @classmethod
    def _dotted(cls, paths: dict[str, str]) -> dict[str, str]:
        for key, where in paths.items():
            if not where or any(not seg.strip() for seg in where.split(".")):
                raise ValueError(
                    f"{key}: {where!r} is not a dotted path in the file (e.g. search.hybrid.vector_weight)"
                )
        return paths


class RequestChannelConfig(StrictModel):
    """``channel: request``: each trial's values travel in the search request itself
    (tuner.evaluation.request_binding); no file is patched and nothing restarts."""

    bind: dict[str, str] = Field(
        min_length=1,
        description=(
            "Config key -> its place in evaluation.request: body.<dotted path> (a number indexes a list, "
            "body.vectorQueries.1.weight), query.<parameter> or header.<name>. The value declared there is "
            "the production value (the baseline)."
        ),
    )
    apply_to: ApplyToConfig | None = Field(
        default=None,
        description=(
            "Where the calling application reads these values: `tuner apply` writes the winning ones there "
            "(diff, re-check, backup, re-measure, rollback); absent: it prints the request fragment to use."
        ),
    )

    @model_validator(mode="after")
    def _every_key_placed(self) -> RequestChannelConfig:
        if self.apply_to is None:
            return self
        unknown = sorted(set(self.apply_to.paths) - set(self.bind))
        if unknown:
            raise ValueError(
                f"apply_to.paths: {', '.join(unknown)} is not bound in request.bind; "
                f"name the bound config keys ({', '.join(sorted(self.bind))})"
            )
        missing = sorted(set(self.bind) - set(self.apply_to.paths))
        if missing:
            raise ValueError(
                f"apply_to.paths has no place for {', '.join(missing)} (bound in request.bind): give its path in "
                f"{self.apply_to.file} (apply_to.paths.{missing[0]}: <dotted path>), or remove apply_to"
            )
        return self


class HttpChannelConfig(StrictModel):
    """``channel: http``: the backend's config is a JSON document behind an HTTP API
    (tuner.study.trial.http_channel): GET it, patch its dotted paths, PUT / POST it back,
    confirm by reading it back (or by a fingerprint in the health answer)."""

    url: str = Field(description="The config document's URL: GET reads it, method writes it; {port} is filled.")
    method: Literal["PUT", "POST"] = "PUT"
    headers: dict[str, str] = Field(
        default_factory=dict, description="Sent with every GET and write (secrets are redacted wherever shown)."
    )
    read_back: bool = Field(
        default=True, description="Confirm each write by a GET whose document equals the one sent (as JSON)."
    )
    fingerprint: str | None = Field(
        default=None,
        pattern=_DOTTED,
        description=(
            "Confirm each write instead by this dotted field of the health JSON, which must equal the ETag "
            "the write answered (read_back: false)."
        ),
    )
    document: str | None = Field(
        default=None,
        description=(
            "Where the document sits in the GET answer when the server wraps it (OpenSearch's GET "
            "/_search/pipeline/NAME answers {NAME: {...}}, PUT takes the {...}): that key (dotted); "
            "absent: the whole answer is the document."
        ),
    )
    timeout_s: PositiveFloat = 30.0

    @model_validator(mode="after")
    def _confirmed(self) -> HttpChannelConfig:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"http.url {self.url!r} is not an http(s) URL; give the config document's URL")
        if not self.read_back and self.fingerprint is None:
            raise ValueError(
                "http: a write must be confirmed: keep read_back: true, or give fingerprint: the health JSON "
                "field that reports the ETag of the config served (e.g. fingerprint: config_hash)"
            )
        return self


class TargetConfig(StrictModel):
    config_files: list[Path] = Field(default_factory=list)
    channel: Literal["file", "request", "http"] = Field(
        default="file",
        description=(
            "How a trial's values reach the backend: file (patch config_files, then reload or restart), "
            "request (bound into every search request: target.request.bind) or http (a JSON config document "
            "read and written over HTTP: target.http)."
        ),
    )
    request: RequestChannelConfig | None = None
    http: HttpChannelConfig | None = None
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
    reload: ReloadConfig | None = Field(
        default=None,
        description=(
            "Apply a new config without a restart (an HTTP call or a signal), confirmed by the config "
            "fingerprint the health JSON reports; absent: restart every trial."
        ),
    )

    @property
    def apply_to(self) -> ApplyToConfig | None:
        """channel: request: the application's file `tuner apply` writes (request.apply_to), or None."""
        return self.request.apply_to if self.channel == "request" and self.request is not None else None

    @property
    def config_urls(self) -> list[str]:
        """The config documents written over HTTP (channel: http), each locked like a file."""
        return [self.http.url] if self.channel == "http" and self.http is not None else []

    @field_validator("config_files")
    @classmethod
    def _known_format(cls, files: list[Path]) -> list[Path]:
        # the format (YAML, JSON, TOML) is the suffix's: refuse an unknown one at load,
        # not at the first trial
        from tuner.config.formats import check_suffix

        for f in files:
            problem = check_suffix(f)
            if problem is not None:
                raise ValueError(problem)
        return files

    @model_validator(mode="after")
    def _section_for_apply(self) -> TargetConfig:
        if self.channel == "file" and not self.config_files:
            raise ValueError(
                "config_files: give the backend's config file(s) the tuner patches "
                "(or channel: request with request.bind, for a backend that takes the values per request)"
            )
        if self.channel == "request":
            if self.request is None:
                raise ValueError(
                    "channel: request needs request.bind: each tuned config key -> its place in "
                    "evaluation.request (e.g. fusion.rrf_k: body.overrides.fusion.rrf_k)"
                )
            if self.reload is not None:
                raise ValueError("channel: request changes no config to reload; remove target.reload")
        elif self.request is not None:
            raise ValueError("request.bind is read with channel: request only; set channel: request or remove it")
        if self.channel == "http":
            if self.http is None:
                raise ValueError(
                    "channel: http needs an http: section with the config document's url "
                    "(e.g. http: {url: 'http://127.0.0.1:{port}/admin/config'})"
                )
            if self.reload is not None:
                raise ValueError(
                    "channel: http writes the config through its API, which serves it; remove target.reload"
                )
            if self.config_files:
                raise ValueError("channel: http patches the document at http.url, not files; remove config_files")
            if self.apply != "none":
                raise ValueError(
                    f"channel: http reads the config document before any backend is started, so the engine must "
                    f"already run: set apply: none (not {self.apply}) and start it yourself"
                )
        elif self.http is not None:
            raise ValueError("http: is read with channel: http only; set channel: http or remove it")
        if self.apply == "process" and self.process is None:
            raise ValueError("apply: process needs a process: section with a command")
        if self.apply == "docker" and self.docker is None:
            raise ValueError("apply: docker needs a docker: section with the compose service")
        if self.reload is not None:
            if self.apply == "none":
                raise ValueError(
                    "reload with apply: none: the tuner needs a backend it can restart when a reload "
                    "fails; use apply: process or docker, or remove reload"
                )
            if self.reload.fingerprint_file >= len(self.config_files):
                raise ValueError(
                    f"reload.fingerprint_file {self.reload.fingerprint_file} is out of range: "
                    f"config_files has {len(self.config_files)} file(s) (0-based index)"
                )
        return self
