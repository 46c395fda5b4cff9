"""Small real collaborators for study / trial tests.

The config is a real YAML file on disk; the "backend" is a `FileBackend` target that
reads that file on restart (like the reference backend reads its config at start-up);
the evaluator scores what the backend loaded. Only the search engine itself is
replaced: metrics are formulas of the loaded parameters, so tests can state expected
values as those formulas.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from ruamel.yaml import YAML

from tuner.config.objective import Constraint
from tuner.errors import BackendExited, FailureBudgetExceeded, HealthTimeout


class MetricNamed(Constraint):
    """An experiment constraint recorded under its metric's name (``OOS_FP_Rate``), the
    name these tests' trials carry, instead of ``OOS_FP_Rate <= 0.1``."""

    @property
    def name(self) -> str:
        return self.metric


def oos_constraint(limit: float) -> Constraint:
    """``OOS_FP_Rate <= limit``, recorded as ``OOS_FP_Rate``."""
    return MetricNamed(metric="OOS_FP_Rate", op="<=", bound=limit)


def score(x: float, k: int) -> float:
    """The fake backend's Primary_Metric_Score: best at x = 0.7, k = 40 (infeasible: the
    OOS constraint pulls the best feasible trial down to x <= 0.5)."""
    return 1.0 - (x - 0.7) ** 2 - ((k - 40) / 100.0) ** 2


def oos_rate(x: float) -> float:
    """The fake backend's OOS false-positive rate: rises with x (x > 0.5 is infeasible at 0.10)."""
    return 0.2 * x


class TwoParamSpace:
    """A search space with the SearchSpace.suggest contract: x (float), k (int, step 10)."""

    def __init__(self, discrete: bool = False) -> None:
        self.discrete = discrete

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        if self.discrete:
            x = trial.suggest_categorical("x", [0.1, 0.3])
        else:
            x = trial.suggest_float("x", 0.0, 1.0)
        return {"fusion.x": x, "fusion.k": trial.suggest_int("k", 10, 60, step=10)}

    @staticmethod
    def params_for(assignment: Mapping[str, Any]) -> dict[str, Any]:
        return {"x": assignment["fusion.x"], "k": assignment["fusion.k"]}


@dataclass
class YamlWriter:
    """ConfigWriter over one real file; keeps the original text for restore."""

    path: Path
    original: str = ""
    writes: int = 0

    def __post_init__(self) -> None:
        self.original = self.path.read_text()

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]:
        yaml = YAML()
        doc = yaml.load(self.original)
        for dotted, value in assignment.items():
            node = doc
            *head, last = dotted.split(".")
            for part in head:
                node = node[part]
            node[last] = value
        from io import StringIO

        buf = StringIO()
        yaml.dump(doc, buf)
        return {self.path: buf.getvalue()}

    def write(self, texts: Mapping[Path, str]) -> None:
        for path, text in texts.items():
            path.write_text(text)
        self.writes += 1

    def restore(self) -> None:
        self.path.write_text(self.original)


@dataclass
class FileBackend:
    """A Target whose 'process' loads the config file at restart.

    ``crash_when(loaded) -> str | None``: the backend dies on such configs (reason).
    """

    path: Path
    crash_when: Callable[[dict[str, Any]], str | None] = lambda cfg: None
    loaded: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    dead: str | None = None

    def start(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.restarts += 1
        self.loaded = json.loads(json.dumps(YAML(typ="safe").load(self.path.read_text())))
        self.dead = self.crash_when(self.loaded)

    def stop(self) -> None:
        self.dead = "stopped"

    def failure(self) -> str | None:
        return self.dead

    def close(self) -> None:
        self.stop()

    def wait_healthy(self) -> None:
        if self.dead is not None:
            raise BackendExited(f"backend exited: {self.dead}")
        if self.loaded["fusion"].get("slow"):
            raise HealthTimeout("backend not healthy after 1.0 s (last status 503)")


@dataclass
class FakeResult:
    metrics: dict[str, float]


@dataclass
class FormulaEvaluator:
    """Scores whatever config the backend has loaded."""

    backend: FileBackend
    fingerprint_parts: tuple[str, str, str] = ("dataset-hash", "labels-fp", "spec")
    calls: int = 0
    failed_queries_when: Callable[[dict[str, Any]], int] = lambda cfg: 0

    @property
    def dataset_hash(self) -> str:
        return self.fingerprint_parts[0]

    @property
    def labels_fingerprint(self) -> str:
        return self.fingerprint_parts[1]

    @property
    def spec_fingerprint(self) -> str:
        return self.fingerprint_parts[2]

    last_search_seconds: float = 0.0

    def evaluate(self, *, order_seed: int, on_result) -> FakeResult:
        self.calls += 1
        self.last_search_seconds = 0.001
        fusion = self.backend.loaded["fusion"]
        failed = self.failed_queries_when(self.backend.loaded)
        if failed > 2:
            raise FailureBudgetExceeded(f"{failed} of 10 queries failed (max_failed_queries=2); last: q3: timeout")
        for i in range(3):
            if on_result is not None:
                on_result(f"q{i}", {"Primary_Metric_Score": score(float(fusion["x"]), int(fusion["k"]))})
        x, k = float(fusion["x"]), int(fusion["k"])
        return FakeResult(
            {
                "Primary_Metric_Score": score(x, k),
                "OOS_FP_Rate": oos_rate(x),
                "NDCG@20": score(x, k) / 2,
                "Judged@10": 0.9,
                "Failed_Queries": float(failed),
            }
        )

    def report_paths(self, result: FakeResult, out_dir: Path, *, detail: str = "full") -> dict[str, Path]:
        return {"json": out_dir / "report.json", "markdown": out_dir / "report.md",
                "per_query_csv": out_dir / "per_query.csv"}

    def write_reports(
        self, result: FakeResult, out_dir: Path, *, context: Mapping[str, Any], config_snapshot: str,
        detail: str = "full", pr_curve: str | None = None,
    ) -> dict[str, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        j = out_dir / "report.json"
        j.write_text(json.dumps({"metrics": result.metrics, "context": dict(context), "detail": detail}))
        md = out_dir / "report.md"
        md.write_text("# report\n\n" + "\n".join(f"- {k}: {v}" for k, v in result.metrics.items()))
        csv = out_dir / "per_query.csv"
        csv.write_text("query_id,Primary_Metric_Score\nq1,0.5\n")
        return {"json": j, "markdown": md, "per_query_csv": csv}


CONFIG_TEXT = """\
# fake backend config
fusion:
  x: 0.8   # a comment that must survive
  k: 20
"""


def run_one(study: optuna.Study, runner: Any, params: dict | None = None):
    """Ask one trial (``params`` enqueued first when given), run it, tell Optuna; the
    outcome and the recorded trial."""
    from optuna.trial import TrialState

    if params is not None:
        study.enqueue_trial(params)
    trial = study.ask()
    outcome = runner.run(trial)
    if outcome.state == "COMPLETE":
        study.tell(trial, outcome.value)
    else:
        study.tell(trial, state=TrialState.FAIL)
    return outcome, study.trials[-1]
