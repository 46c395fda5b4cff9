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
    Experiment.http_journal_path -> Path         # <state_dir>/restore-journal-http.json (channel: http)
    resolve_sqlite(uri, base) -> str             # relative sqlite:/// URI made absolute
    free_port() -> int                           # tuner.ports: outside the ephemeral range

The sections' models live in their own modules: sampling (sampler, pruner), objective
(objective, constraints, failure_budget), dataset, target, workers, tracking, shortlist,
replay, validation (validation, cv, selection);
evaluation is tuner.evaluation.spec.EvalSpec, holdout tuner.evaluation.holdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from tuner import secrets
from tuner.config.dataset import DatasetConfig
from tuner.config.objective import Constraint, FailureBudget, Objective
from tuner.config.replay import ReplayConfig
from tuner.config.sampling import NoPrunerConfig, PrunerConfig, SamplerConfig, TPESamplerConfig
from tuner.config.shortlist import Variant, parse_variants
from tuner.config.strict import StrictModel
from tuner.config.target import TargetConfig
from tuner.config.tracking import TrackingConfig
from tuner.config.validation import CrossValConfig, Selection, Validation
from tuner.config.workers import WorkerSettings
from tuner.config.yamlfile import load_model, read_yaml
from tuner.errors import ConfigError
from tuner.evaluation.holdout import HoldoutConfig
from tuner.evaluation.spec import EvalSpec
from tuner.files import display_path
from tuner.ports import free_port

__all__ = [
    "Experiment",
    "ExperimentFile",
    "free_port",
    "load_experiment",
    "resolve_sqlite",
]

_PLACEHOLDER_PORT = "{port}"


# ---------------------------------------------------------------- experiment


class ExperimentFile(StrictModel):
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
    secondary_objective: Objective | None = Field(
        default=None,
        description=(
            "A second objective beside the first (e.g. {metric: Latency_P95_ms, direction: minimize}): the study "
            "becomes multi-objective and finds the Pareto front of the two under the constraints (tuner best --pareto)."
        ),
    )
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
    pipeline: bool = Field(
        default=True,
        description=(
            "Begin the next trial (ask, suggest, render) and end the last one (scoring, records, tell) while a trial "
            "is measured, so the backend waits for nothing but its own work (tuner.study.pipeline). false: strictly "
            "one trial after the other."
        ),
    )
    # Off by default: a small query set split 70/30 tunes on too few queries to be useful.
    replay: ReplayConfig | None = Field(
        default=None,
        description=(
            "Fusion params solved per trial from one explained retrieval and verified live (tuner.config.replay)."
        ),
    )
    holdout: HoldoutConfig = Field(
        default_factory=lambda: HoldoutConfig(enabled=False),
        description="Seeded tune/holdout split; the study tunes on the tune part and validates on the holdout.",
    )
    validation: Validation | None = Field(
        default=None,
        description=("holdout | cv | both (tuner.config.validation); left out: both with holdout.enabled, else cv."),
    )
    cv: CrossValConfig = Field(default_factory=CrossValConfig, description="The cross-validated estimate's folds.")
    selection: Selection = Field(
        default="best",
        description=(
            "best | robust: the cross-validated estimate's pick rule (tuner.study.crossval); robust picks the "
            "setting whose neighbourhood of like settings scores best. Both rules' cross-validated scores are shown."
        ),
    )

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [Constraint.parse(c) if isinstance(c, str) else c for c in v]
        return v

    @model_validator(mode="after")
    def _validation(self) -> ExperimentFile:
        """``validation`` decides whether the holdout is drawn; an explicit ``holdout.enabled``
        that says otherwise is a contradiction, not a preference."""
        if self.validation is None:
            return self
        wanted = self.validation != "cv"
        written = "holdout" in self.model_fields_set and "enabled" in self.holdout.model_fields_set
        if written and self.holdout.enabled != wanted:
            raise ValueError(
                f"validation: {self.validation} contradicts holdout.enabled: {str(self.holdout.enabled).lower()}; "
                "drop holdout.enabled (validation decides it)"
            )
        if self.holdout.enabled != wanted:
            object.__setattr__(self, "holdout", self.holdout.model_copy(update={"enabled": wanted}))
        return self

    @model_validator(mode="after")
    def _secondary(self) -> ExperimentFile:
        """What a multi-objective study cannot do, refused here in one line each."""
        second = self.secondary_objective
        if second is None:
            return self
        where = "secondary_objective"
        if second.metric == self.objective.metric:
            raise ValueError(
                f"{where}: metric {second.metric} is the objective's; name another metric, e.g. Latency_P95_ms"
            )
        if self.pruner.type != "none":
            raise ValueError(
                f"{where} with pruner {self.pruner.type}: Optuna cannot prune a multi-objective trial; "
                "set pruner: {type: none}"
            )
        if self.sampler.type in ("cmaes", "qmc"):
            raise ValueError(
                f"{where} with sampler {self.sampler.type}: it does not search two objectives; use tpe, nsgaii or gp"
            )
        if self.replay is not None:
            raise ValueError(
                f"{where} with replay: a replayed setting has no latency of its own; "
                "drop replay: (measured trials only)"
            )
        return self

    @property
    def cross_validates(self) -> bool:
        """The cross-validated estimate is shown (validation cv or both, or left out)."""
        return self.validation != "holdout"

    @model_validator(mode="after")
    def _stop_condition(self) -> ExperimentFile:
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
    def http_journal_path(self) -> Path:
        """``target.channel: http``: the original config document, kept while trials write
        theirs (tuner.targets.http_config)."""
        return self.state_dir / "restore-journal-http.json"

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

    def bind_port(self, port: int | None = None) -> Experiment:
        """A copy with ``{port}`` filled in the health URL, the reload URL, the search URL and the command.

        ``port`` wins; else ``target.port`` (``auto``: a free loopback port, picked now).
        Without any port the experiment is returned unchanged.
        """
        if port is None:
            port = free_port() if self.target.port == "auto" else self.target.port
        if port is None:
            return self

        def fill(text: str) -> str:
            return text.replace(_PLACEHOLDER_PORT, str(port))

        health = self.target.health.model_copy(update={"url": fill(self.target.health.url)})
        update: dict[str, Any] = {"port": port, "health": health}
        reload = self.target.reload
        if reload is not None and reload.http is not None:
            http = reload.http.model_copy(update={"url": fill(reload.http.url)})
            update["reload"] = reload.model_copy(update={"http": http})
        if self.target.http is not None:  # channel: http's config document URL
            update["http"] = self.target.http.model_copy(update={"url": fill(self.target.http.url)})
        target = self.target.model_copy(update=update)
        request = self.evaluation.request.model_copy(update={"url": fill(self.evaluation.request.url)})
        evaluation = self.evaluation.model_copy(update={"request": request})
        return self.model_copy(update={"target": target, "evaluation": evaluation})


def load_experiment(path: Path | str, *, check_paths: bool = True) -> Experiment:
    """Read, validate and resolve an experiment file (see the module docstring).

    With ``check_paths`` (default) the search space, the query file and the config
    files must exist; ``tuner demo`` turns it off to load before generating its data.
    """
    path = Path(path).resolve()
    doc = read_yaml(path)
    raw = load_model(path, ExperimentFile, data=doc)
    _remember_header_secrets(raw.target)
    base = path.parent
    where = display_path(path)

    def rel(p: Path | None) -> Path | None:
        return None if p is None else (p if p.is_absolute() else base / p).resolve()

    root = rel(raw.project_root) or _find_project_root(base)
    state_dir = rel(raw.state_dir) or root / ".tuner"
    storage = resolve_sqlite(raw.storage, base) if raw.storage else f"sqlite:///{state_dir / 'optuna.db'}"

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
            "mlflow_uri": resolve_sqlite(raw.tracking.mlflow_uri, base)
            if raw.tracking.mlflow_uri
            else f"sqlite:///{root / 'mlruns' / 'mlflow.db'}",
            "artifact_location": rel(raw.tracking.artifact_location) or root / "mlruns",
            "experiment_name": raw.tracking.experiment_name or raw.study,
        }
    )
    if isinstance(raw.shortlist, Path):
        shortlist_path = rel(raw.shortlist)
        assert shortlist_path is not None
        variants = parse_variants(read_yaml(shortlist_path), display_path(shortlist_path))
        shortlist: Any = shortlist_path
    else:
        variants = parse_variants(raw.shortlist, f"{where}: shortlist")
        shortlist = raw.shortlist

    search_space = rel(raw.search_space)
    assert search_space is not None
    checked = [("search_space", search_space), ("dataset.queries", dataset.queries)] + [
        (f"target.config_files[{i}]", f) for i, f in enumerate(target.config_files)
    ]
    for label, p in checked if check_paths else []:
        if not p.exists():
            raise ConfigError(
                f"{where}: {label}: {display_path(p)} does not exist (paths are relative to {display_path(base)})"
            )
    for i, (written, pattern) in enumerate(zip(raw.target.inputs, target.inputs, strict=True) if check_paths else []):
        _check_input(f"{where}: target.inputs[{i}]", written, pattern, base)

    fields = raw.model_dump(
        exclude={
            "project_root",
            "state_dir",
            "storage",
            "dataset",
            "target",
            "tracking",
            "shortlist",
            "search_space",
            "sampler",
            "pruner",
            "evaluation",
        }
    )
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


def _remember_header_secrets(t: TargetConfig) -> None:
    """Every value of ``target.health.headers`` and ``target.reload.http.headers`` is a
    credential (a key is why a health or reload call sends a header at all), whatever the
    header is called: scrubbed from every text the tuner writes or prints."""
    values = list(t.health.headers.values())
    if t.reload is not None and t.reload.http is not None:
        values += t.reload.http.headers.values()
    secrets.remember(*values)


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
    if t.request is not None and t.request.apply_to is not None:  # the application's file, for tuner apply
        apply_to = t.request.apply_to.model_copy(update={"file": rel(t.request.apply_to.file)})
        update["request"] = t.request.model_copy(update={"apply_to": apply_to})
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


def resolve_sqlite(uri: str, base: Path) -> str:
    """``sqlite:///rel/x.db`` -> ``sqlite:////abs/rel/x.db``; other URIs unchanged.

    SQLAlchemy (optuna, MLflow) resolves a relative path against the current directory; a
    study run from elsewhere would then scatter databases around.
    """
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + str((base / uri[len(prefix) :]).resolve())
    return uri


def _find_project_root(start: Path) -> Path:
    for d in [start, *start.parents]:
        if any((d / marker).exists() for marker in ("pyproject.toml", ".git", ".tuner")):
            return d
    return start
