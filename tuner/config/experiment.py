"""Experiment files (experiments/*.yaml): one typed document says everything a study needs.

``load_experiment(path) -> Experiment`` validates the file (unknown keys are refused
with file:line and a "did you mean"), loads the shortlist, and resolves every path:

- a relative path written in the file is resolved against the experiment file's
  directory;
- the *project root* is ``project_root`` when given, else the nearest ancestor of the
  experiment file's directory holding ``pyproject.toml``, ``.git`` or ``.tuner``, else
  the experiment file's directory;
- defaults live under the project root: ``state_dir`` = ``<root>/.tuner``, ``storage`` =
  ``sqlite:///<state_dir>/optuna.db``, ``dataset.labels_db`` = ``<state_dir>/labels.db``,
  ``tracking.mlflow_uri`` = ``sqlite:///<root>/mlruns/mlflow.db``,
  ``tracking.artifact_location`` = ``<root>/mlruns``, ``target.process.log_file`` =
  ``<state_dir>/backend.log``;
- relative ``sqlite:///`` URIs (storage, mlflow_uri) are made absolute the same way.

``{port}`` in ``target.health.url``, ``evaluation.request.url`` and the process command
is filled by ``Experiment.bind_port(port)``; ``target.port: auto`` picks a free loopback
port there.

Public API::

    load_experiment(path) -> Experiment
    Experiment.bind_port(port: int | None = None) -> Experiment
    Experiment.journal_path -> Path              # <state_dir>/restore-journal.json
    Constraint.parse("OOS_FP_Rate <= 0.10") -> Constraint; .violation(metrics) -> float
    SamplerConfig.ignores_constraints -> bool; .create() -> optuna sampler
    PrunerConfig.create() -> optuna pruner
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import optuna
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from tuner.config.yamlfile import display_path, load_model, read_yaml, to_plain
from tuner.errors import ConfigError
from tuner.evaluation.holdout import HoldoutConfig
from tuner.evaluation.spec import EvalSpec

__all__ = [
    "Constraint",
    "DatasetConfig",
    "Experiment",
    "HealthConfig",
    "ProcessConfig",
    "TargetConfig",
    "TrackingConfig",
    "Variant",
    "WorkerSettings",
    "load_experiment",
]

_PLACEHOLDER_PORT = "{port}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- samplers and pruners


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class _SamplerBase(_Model):
    seed: int | None = None

    #: CMA-ES, random and QMC never read trial constraints (optuna 5).
    _ignores_constraints: ClassVar[bool] = False

    @property
    def ignores_constraints(self) -> bool:
        return self._ignores_constraints


class TPESamplerConfig(_SamplerBase):
    type: Literal["tpe"] = "tpe"
    multivariate: bool = True
    group: bool = True  # with conditional params, multivariate TPE needs group=True to model them jointly
    n_startup_trials: int = Field(default=10, ge=0)
    constant_liar: bool = False  # set true with several parallel workers

    def create(self) -> optuna.samplers.BaseSampler:
        with _quiet_experimental():  # multivariate/group are a deliberate, documented choice
            return optuna.samplers.TPESampler(
                seed=self.seed,
                multivariate=self.multivariate,
                group=self.group and self.multivariate,
                n_startup_trials=self.n_startup_trials,
                constant_liar=self.constant_liar,
            )


class RandomSamplerConfig(_SamplerBase):
    type: Literal["random"]
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=self.seed)


class GPSamplerConfig(_SamplerBase):
    type: Literal["gp"]
    n_startup_trials: int = Field(default=10, ge=0)

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)


class NSGAIISamplerConfig(_SamplerBase):
    type: Literal["nsgaii"]
    population_size: int = Field(default=50, ge=2)

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=self.seed, population_size=self.population_size)


class CmaEsSamplerConfig(_SamplerBase):
    type: Literal["cmaes"]
    n_startup_trials: int = Field(default=1, ge=0)
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)


class QMCSamplerConfig(_SamplerBase):
    type: Literal["qmc"]
    qmc_type: Literal["sobol", "halton"] = "sobol"
    scramble: bool = True
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.QMCSampler(seed=self.seed, qmc_type=self.qmc_type, scramble=self.scramble)


SamplerConfig = Annotated[
    Union[  # noqa: UP007
        TPESamplerConfig, RandomSamplerConfig, GPSamplerConfig, NSGAIISamplerConfig, CmaEsSamplerConfig, QMCSamplerConfig
    ],
    Field(discriminator="type"),
]


class NoPrunerConfig(_Model):
    type: Literal["none"] = "none"

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()


class MedianPrunerConfig(_Model):
    type: Literal["median"]
    n_startup_trials: int = Field(default=5, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    interval_steps: PositiveInt = 1

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(self.n_startup_trials, self.n_warmup_steps, self.interval_steps)


class PercentilePrunerConfig(_Model):
    type: Literal["percentile"]
    percentile: float = Field(default=25.0, ge=0, le=100)
    n_startup_trials: int = Field(default=5, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    interval_steps: PositiveInt = 1

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.PercentilePruner(
            self.percentile, self.n_startup_trials, self.n_warmup_steps, self.interval_steps
        )


class WilcoxonPrunerConfig(_Model):
    type: Literal["wilcoxon"]
    p_threshold: float = Field(default=0.1, gt=0, lt=1)
    n_startup_steps: int = Field(default=2, ge=0)

    def create(self) -> optuna.pruners.BasePruner:
        with _quiet_experimental():
            return optuna.pruners.WilcoxonPruner(p_threshold=self.p_threshold, n_startup_steps=self.n_startup_steps)


PrunerConfig = Annotated[
    Union[NoPrunerConfig, MedianPrunerConfig, PercentilePrunerConfig, WilcoxonPrunerConfig],  # noqa: UP007
    Field(discriminator="type"),
]


# ---------------------------------------------------------------- objective and constraints


class Objective(_Model):
    metric: str = "Primary_Metric_Score"
    direction: Literal["maximize", "minimize"] = "maximize"


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][\w@.\-]*)\s*(<=|>=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


class Constraint(_Model):
    """``metric op bound``; ``violation`` <= 0 means feasible (optuna's convention)."""

    metric: str
    op: Literal["<=", ">="]
    bound: float

    @classmethod
    def parse(cls, text: str) -> "Constraint":
        m = _CONSTRAINT_RE.match(text)
        if not m:
            raise ValueError(
                f"cannot parse constraint {text!r}: write 'METRIC <= NUMBER' or 'METRIC >= NUMBER', "
                "e.g. 'OOS_FP_Rate <= 0.10'"
            )
        return cls(metric=m.group(1), op=m.group(2), bound=float(m.group(3)))  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"

    def violation(self, metrics: Mapping[str, float]) -> float:
        """How far ``metrics`` break the constraint (<= 0: feasible; NaN metric: +inf)."""
        if self.metric not in metrics:
            raise ConfigError(
                f"constraint {self.name!r}: metric {self.metric} is not in the report "
                f"(known: {', '.join(sorted(metrics))}); fix the constraint's metric name"
            )
        value = float(metrics[self.metric])
        if math.isnan(value):
            return math.inf
        return value - self.bound if self.op == "<=" else self.bound - value


class FailureBudget(_Model):
    max_consecutive: PositiveInt = 3
    max_total: PositiveInt = 10


# ---------------------------------------------------------------- dataset


class LabelSource(_Model):
    path: Path
    format: Literal["qrels", "jsonl", "csv"] = "qrels"
    grade_map: dict[str, int] | None = Field(
        default=None, description="Raw grade -> 0..3 (e.g. Cranfield codes); keys compared as strings."
    )

    @field_validator("grade_map", mode="before")
    @classmethod
    def _keys_as_str(cls, v: Any) -> Any:
        return {str(k): g for k, g in v.items()} if isinstance(v, Mapping) else v

    @field_validator("grade_map")
    @classmethod
    def _grades(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        for raw, grade in (v or {}).items():
            if not 0 <= grade <= 3:
                raise ValueError(f"grade_map {raw}: {grade} is not a grade 0..3 (map to 0..3)")
        return v


class DatasetConfig(_Model):
    queries: Path
    dataset_id: str | None = Field(default=None, description="Default: derived from the query file by tuner.data.dataset.")
    labels_db: Path | None = None
    labels: list[LabelSource] = Field(default_factory=list, description="Imported when missing from labels_db.")
    unjudged_queries: Literal["drop", "keep", "error"] = Field(
        default="drop",
        description="In-scope queries with no judgment at all: drop them (counted and said), keep them (each "
        "scores 0 whatever the config) or stop with an error.",
    )


# ---------------------------------------------------------------- target


class ProcessConfig(_Model):
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


class DockerConfig(_Model):
    """A compose service whose containers are restarted (issue 5 extends this model)."""

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


class NoneConfig(_Model):
    """The backend watches its config and reloads by itself."""

    settle_s: float = Field(default=0.0, ge=0, description="Pause after patching before the health wait.")


class HealthConfig(_Model):
    url: str
    deadline_s: PositiveFloat = 60.0
    interval_s: PositiveFloat = 0.2
    fingerprint: str | None = Field(
        default=None,
        pattern=r"^[^.\s]+(\.[^.\s]+)*$",
        description="Dotted field of the health JSON holding the fingerprint of the data the backend loaded; "
        "part of the result-cache key.",
    )


class TargetConfig(_Model):
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


# ---------------------------------------------------------------- workers


class WorkerSettings(_Model):
    """The ``workers:`` section: how `tuner worker` replicas share one study.

    Replica N gets its own copy of the config files, its own state dir, its own port
    (``ports``) and, for docker targets, its own compose project (``replica_name``).
    The CLI overrides every field.
    """

    count: PositiveInt = Field(1, description="replicas `tuner worker --all` starts on this machine")
    ports: Literal["auto"] | PositiveInt | list[PositiveInt] = Field(
        "auto", description="replica N's port: auto (a free one), BASE + N, or the N-th of a list")
    replica_name: str = Field("{name}-r{replica}", description=(
        "replica N's compose project (docker targets); {name}: target.docker.project (else the compose "
        "project name), {replica}: N"))
    heartbeat_interval_s: int = Field(30, ge=1, description="how often a running trial proves its worker is alive")
    grace_period_s: int | None = Field(
        None, ge=1, description="a trial silent this long is failed and retried (default: 4 x heartbeat_interval_s)"
    )
    max_retry: int = Field(2, ge=0, description="retries of one crashed trial before it stays failed")

    @model_validator(mode="after")
    def _consistent(self) -> "WorkerSettings":
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


# ---------------------------------------------------------------- tracking, shortlist


class TrackingConfig(_Model):
    enabled: bool = True
    mlflow_uri: str | None = None
    artifact_location: Path | None = None
    experiment_name: str | None = Field(default=None, description="Default: the study name.")


class Variant(_Model):
    """A fixed assignment enqueued before sampling (partial assignments are allowed)."""

    name: str | None = None
    values: dict[str, Any]


def _parse_variants(raw: Any, where: str) -> list[Variant]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: shortlist must be a list of mappings (dotted path -> value, optional name:)")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item:
            raise ConfigError(f"{where}: shortlist[{i}]: expected a non-empty mapping of dotted path -> value")
        item = dict(to_plain(item))
        name = item.pop("name", None)
        if not item:
            raise ConfigError(f"{where}: shortlist[{i}]: the variant sets no values")
        out.append(Variant(name=None if name is None else str(name), values=item))
    return out


# ---------------------------------------------------------------- experiment


class ExperimentFile(_Model):
    """The YAML document of an experiment file, before paths are resolved."""

    study: str = Field(min_length=1, description="Study name: created or resumed by name.")
    description: str | None = None
    project_root: Path | None = None
    state_dir: Path | None = None
    storage: str | None = None
    sampler: SamplerConfig = Field(default_factory=TPESamplerConfig)
    pruner: PrunerConfig = Field(default_factory=NoPrunerConfig)
    n_trials: PositiveInt | None = None
    timeout_s: PositiveFloat | None = None
    objective: Objective = Field(default_factory=Objective)
    constraints: list[Constraint] = Field(default_factory=lambda: [Constraint.parse("OOS_FP_Rate <= 0.10")])
    failure_budget: FailureBudget = Field(default_factory=FailureBudget)
    dataset: DatasetConfig
    target: TargetConfig
    evaluation: EvalSpec
    search_space: Path
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    workers: WorkerSettings = Field(default_factory=WorkerSettings)
    shortlist: Path | list[dict[str, Any]] | None = None
    baseline: bool = True
    # Off by default: a small query set split 70/30 tunes on too few queries to be useful.
    holdout: HoldoutConfig = Field(
        default_factory=lambda: HoldoutConfig(enabled=False),
        description="Seeded tune/holdout split; the study tunes on the tune part and validates on the holdout.",
    )

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [Constraint.parse(c) if isinstance(c, str) else c for c in v]
        return v

    @model_validator(mode="after")
    def _stop_condition(self) -> "ExperimentFile":
        if self.n_trials is None and self.timeout_s is None:
            raise ValueError("give n_trials and/or timeout_s so the study knows when to stop")
        return self


class Experiment(ExperimentFile):
    """An experiment with every path absolute and every default filled in."""

    source: Path
    project_root: Path
    state_dir: Path
    storage: str
    variants: list[Variant] = Field(default_factory=list)

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "restore-journal.json"

    @property
    def warnings(self) -> list[str]:
        """Non-fatal problems worth printing (e.g. a sampler that ignores constraints)."""
        out = []
        if self.constraints and self.sampler.ignores_constraints:
            out.append(
                f"{display_path(self.source)}: sampler {self.sampler.type} ignores constraints: "
                "infeasible trials still steer the search (use tpe, gp or nsgaii)"
            )
        return out

    def bind_port(self, port: int | None = None) -> "Experiment":
        """A copy with ``{port}`` filled in the health URL, the search URL and the command.

        ``port`` wins; else ``target.port`` (``auto``: a free loopback port, picked now).
        Without any port the experiment is returned unchanged.
        """
        if port is None:
            port = free_port() if self.target.port == "auto" else self.target.port  # type: ignore[assignment]
        if port is None:
            return self
        fill = lambda s: s.replace(_PLACEHOLDER_PORT, str(port))  # noqa: E731
        health = self.target.health.model_copy(update={"url": fill(self.target.health.url)})
        target = self.target.model_copy(update={"port": port, "health": health})
        request = self.evaluation.request.model_copy(update={"url": fill(self.evaluation.request.url)})
        evaluation = self.evaluation.model_copy(update={"request": request})
        return self.model_copy(update={"target": target, "evaluation": evaluation})


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port that was free a moment ago (the backend binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def load_experiment(path: Path | str, *, check_paths: bool = True) -> Experiment:
    """Read, validate and resolve an experiment file (see the module docstring).

    With ``check_paths`` (default) the search space, the query file and the config
    files must exist; ``tuner demo`` turns it off to load before generating its data.
    """
    path = Path(path).resolve()
    doc = read_yaml(path)
    raw = load_model(path, ExperimentFile, data=doc)
    base = path.parent
    where = display_path(path)

    def rel(p: Path | None) -> Path | None:
        return None if p is None else (p if p.is_absolute() else base / p).resolve()

    root = rel(raw.project_root) or _find_project_root(base)
    state_dir = rel(raw.state_dir) or root / ".tuner"
    storage = _resolve_sqlite(raw.storage, base) if raw.storage else f"sqlite:///{state_dir / 'optuna.db'}"

    dataset = raw.dataset.model_copy(
        update={
            "queries": rel(raw.dataset.queries),
            "labels_db": rel(raw.dataset.labels_db) or state_dir / "labels.db",
            "labels": [lab.model_copy(update={"path": rel(lab.path)}) for lab in raw.dataset.labels],
        }
    )
    target = _resolve_target(raw.target, rel, state_dir)
    tracking = raw.tracking.model_copy(
        update={
            "mlflow_uri": _resolve_sqlite(raw.tracking.mlflow_uri, base)
            if raw.tracking.mlflow_uri
            else f"sqlite:///{root / 'mlruns' / 'mlflow.db'}",
            "artifact_location": rel(raw.tracking.artifact_location) or root / "mlruns",
            "experiment_name": raw.tracking.experiment_name or raw.study,
        }
    )
    if isinstance(raw.shortlist, Path):
        shortlist_path = rel(raw.shortlist)
        assert shortlist_path is not None
        variants = _parse_variants(read_yaml(shortlist_path), display_path(shortlist_path))
        shortlist: Any = shortlist_path
    else:
        variants = _parse_variants(raw.shortlist, f"{where}: shortlist")
        shortlist = raw.shortlist

    search_space = rel(raw.search_space)
    assert search_space is not None
    checked = [("search_space", search_space), ("dataset.queries", dataset.queries)] + [
        (f"target.config_files[{i}]", f) for i, f in enumerate(target.config_files)
    ]
    for label, p in checked if check_paths else []:
        if not p.exists():
            raise ConfigError(f"{where}: {label}: {display_path(p)} does not exist (paths are relative to {display_path(base)})")
    for i, (written, pattern) in enumerate(zip(raw.target.inputs, target.inputs) if check_paths else []):
        _check_input(f"{where}: target.inputs[{i}]", written, pattern, base)

    fields = raw.model_dump(exclude={"project_root", "state_dir", "storage", "dataset", "target", "tracking",
                                     "shortlist", "search_space", "sampler", "pruner", "evaluation"})
    return Experiment(
        **fields,
        sampler=raw.sampler,
        pruner=raw.pruner,
        evaluation=raw.evaluation,
        source=path,
        project_root=root,
        state_dir=state_dir,
        storage=storage,
        dataset=dataset,
        target=target,
        tracking=tracking,
        shortlist=shortlist,
        search_space=search_space,
        variants=variants,
    )


def _resolve_target(t: TargetConfig, rel: Any, state_dir: Path) -> TargetConfig:
    update: dict[str, Any] = {
        "config_files": [rel(f) for f in t.config_files],
        "inputs": [str(rel(Path(p))) for p in t.inputs],
    }
    if t.process is not None:
        update["process"] = t.process.model_copy(
            update={
                "cwd": rel(t.process.cwd),
                "log_file": rel(t.process.log_file) or state_dir / "backend.log",
            }
        )
    if t.docker is not None:
        update["docker"] = t.docker.model_copy(update={"compose_files": [rel(f) for f in t.docker.compose_files]})
    return t.model_copy(update=update)


def _check_input(label: str, written: str, pattern: str, base: Path) -> None:
    from tuner.data.inputs import MissingInput, expand_one

    try:
        expand_one(pattern)
    except MissingInput as exc:
        raise ConfigError(
            f"{label}: {written} {exc.problem} (paths are relative to {display_path(base)}); "
            "generate the data first, or fix the path"
        ) from exc


def _resolve_sqlite(uri: str, base: Path) -> str:
    """``sqlite:///rel/x.db`` -> ``sqlite:////abs/rel/x.db``; other URIs unchanged."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + str((base / uri[len(prefix):]).resolve())
    return uri


def _find_project_root(start: Path) -> Path:
    for d in [start, *start.parents]:
        if any((d / marker).exists() for marker in ("pyproject.toml", ".git", ".tuner")):
            return d
    return start
