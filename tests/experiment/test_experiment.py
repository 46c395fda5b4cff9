"""Experiment files: typed, unknown keys refused, every path resolved."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import optuna
import pytest

from tuner.config.experiment import load_experiment
from tuner.config.objective import Constraint
from tuner.config.space.loading import load_space
from tuner.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
study: s1
n_trials: 5
dataset:
  queries: data/queries.jsonl
target:
  config_files: [../backend/config.yaml]
  process:
    command: ["{python}", -m, fusion_backend, serve, --config, "{config}", --port, "{port}"]
    cwd: ../backend
  health: {url: "http://127.0.0.1:{port}/health"}
evaluation:
  request: {url: "http://127.0.0.1:{port}/search"}
search_space: space.yaml
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp/pyproject.toml, tmp/backend/config.yaml, tmp/experiments/{exp,space}.yaml, data."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "config.yaml").write_text((REPO / "backend" / "config.yaml").read_text())
    exp_dir = tmp_path / "experiments"
    (exp_dir / "data").mkdir(parents=True)
    (exp_dir / "data" / "queries.jsonl").write_text('{"query_id": "q1", "query": "x"}\n')
    (exp_dir / "space.yaml").write_text((REPO / "search_space" / "reference_fusion.yaml").read_text())
    (exp_dir / "exp.yaml").write_text(MINIMAL)
    return tmp_path


def write_exp(project: Path, text: str) -> Path:
    path = project / "experiments" / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_minimal_file_gets_defaults_under_the_project_root(project: Path) -> None:
    exp = load_experiment(project / "experiments" / "exp.yaml")
    state = project / ".tuner"
    assert exp.project_root == project
    assert exp.state_dir == state
    assert exp.storage == f"sqlite:///{state / 'optuna.db'}"
    assert exp.journal_path.parent == state
    assert exp.dataset.queries == project / "experiments" / "data" / "queries.jsonl"
    assert exp.dataset.labels_db == state / "labels.db"
    assert exp.target.config_files == [project / "backend" / "config.yaml"]
    assert exp.target.process is not None
    assert exp.target.process.cwd == project / "backend"
    assert exp.target.process.log_file == state / "backend.log"
    assert exp.tracking.mlflow_uri == f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    assert exp.tracking.artifact_location == project / "mlruns"
    assert exp.tracking.experiment_name == "s1"
    assert exp.search_space == project / "experiments" / "space.yaml"
    assert exp.constraints == [Constraint(metric="OOS_FP_Rate", op="<=", bound=0.10)]
    assert exp.objective.metric == "Primary_Metric_Score" and exp.objective.direction == "maximize"
    assert exp.failure_budget.max_consecutive == 3 and exp.failure_budget.max_total == 10
    assert exp.sampler.type == "tpe" and exp.sampler.multivariate and exp.pruner.type == "none"
    assert exp.baseline is True and exp.variants == []


def test_explicit_relative_paths_resolve_against_the_experiment_directory(project: Path) -> None:
    path = write_exp(
        project,
        MINIMAL
        + """\
state_dir: state
storage: sqlite:///state/study.db
tracking: {mlflow_uri: "sqlite:///ml/m.db", artifact_location: ml/art}
""",
    )
    exp = load_experiment(path)
    base = project / "experiments"
    assert exp.state_dir == base / "state"
    assert exp.storage == f"sqlite:///{base / 'state' / 'study.db'}"
    assert exp.tracking.mlflow_uri == f"sqlite:///{base / 'ml' / 'm.db'}"
    assert exp.tracking.artifact_location == base / "ml" / "art"
    pg = write_exp(project, MINIMAL + "storage: postgresql://u@localhost/optuna\n")
    assert load_experiment(pg).storage == "postgresql://u@localhost/optuna"


def test_bind_port_fills_every_port_placeholder(project: Path) -> None:
    exp = load_experiment(project / "experiments" / "exp.yaml").bind_port(5123)
    assert exp.target.port == 5123
    assert exp.target.health.url == "http://127.0.0.1:5123/health"
    assert exp.evaluation.request.url == "http://127.0.0.1:5123/search"
    auto = write_exp(project, MINIMAL.replace("  process:", "  port: auto\n  process:"))
    bound = load_experiment(auto).bind_port()
    assert isinstance(bound.target.port, int) and bound.target.port > 0
    assert bound.target.health.url == f"http://127.0.0.1:{bound.target.port}/health"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("samplr: {type: tpe}\n", "exp.yaml:14: samplr: unknown key (did you mean sampler?)"),
        ("sampler: {type: tpe, sed: 1}\n", "exp.yaml:14: sampler.sed: unknown key (did you mean seed?)"),
        ("sampler: {type: anneal}\n", "sampler: Input tag 'anneal'"),
        ("constraints: ['OOS_FP_Rate < 0.1']\n", "constraints: cannot parse constraint 'OOS_FP_Rate < 0.1'"),
        ("failure_budget: {max_total: 0}\n", "failure_budget.max_total: Input should be greater than 0"),
        ("objective: {direction: up}\n", "objective.direction: Input should be 'maximize' or 'minimize'"),
        ("holdout: {fraction: 1.5}\n", "holdout.fraction: Input should be less than 1"),
        ("holdout: {sede: 3}\n", "holdout.sede: unknown key (did you mean seed?)"),
        ("validation: crossval\n", "validation: Input should be 'holdout', 'cv' or 'both'"),
        ("cv: {folds: 1}\n", "cv.folds: Input should be greater than or equal to 2"),
        ("selection: safest\n", "selection: Input should be 'best' or 'robust'"),
        ("validation: cv\nholdout: {enabled: true}\n", "validation: cv contradicts holdout.enabled: true"),
    ],
)
def test_bad_keys_are_refused_with_file_line_and_fix(project: Path, extra: str, needle: str) -> None:
    path = write_exp(project, MINIMAL + extra)
    with pytest.raises(ConfigError) as exc:
        load_experiment(path)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_nested_unknown_keys_name_their_section(project: Path) -> None:
    path = write_exp(project, MINIMAL.replace("    cwd: ../backend", "    cwd: ../backend\n    stop_timeout: 3"))
    with pytest.raises(
        ConfigError, match=r"exp.yaml:10: target.process.stop_timeout: unknown key \(did you mean stop_timeout_s\?\)"
    ):
        load_experiment(path)
    path = write_exp(project, MINIMAL.replace("request: {url:", "request: {urll: x, url:"))
    with pytest.raises(ConfigError, match=r"exp.yaml:12: evaluation.request.urll: unknown key \(did you mean url\?\)"):
        load_experiment(path)


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("search_space: space.yaml", "search_space: nope.yaml", "search_space: experiments/nope.yaml does not exist"),
        (
            "queries: data/queries.jsonl",
            "queries: data/q.jsonl",
            "dataset.queries: experiments/data/q.jsonl does not exist",
        ),
        ("[../backend/config.yaml]", "[../backend/c.yaml]", "target.config_files[0]: backend/c.yaml does not exist"),
        ("n_trials: 5\n", "", "give n_trials and/or timeout_s"),
        ("  process:\n", "  procss:\n", "target.procss: unknown key (did you mean process?)"),
        ("study: s1\n", "", "study: required key is missing"),
    ],
)
def test_missing_files_and_sections_are_reported(
    project: Path, old: str, new: str, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    path = write_exp(project, MINIMAL.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_experiment(path)
    assert needle in str(exc.value)


def test_missing_experiment_file_and_bad_yaml(project: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_experiment(project / "experiments" / "missing.yaml")
    path = write_exp(project, MINIMAL + "sampler: {type: tpe\n")
    with pytest.raises(ConfigError, match=r"exp.yaml:\d+: invalid YAML"):
        load_experiment(path)


def test_constraints_parse_and_measure_violation() -> None:
    fp = Constraint.parse("OOS_FP_Rate <= 0.10")
    assert fp.violation({"OOS_FP_Rate": 0.25}) == pytest.approx(0.25 - 0.10)
    assert fp.violation({"OOS_FP_Rate": 0.05}) == pytest.approx(0.05 - 0.10)
    floor = Constraint.parse("  NDCG@10>=0.4 ")
    assert (floor.metric, floor.op, floor.bound) == ("NDCG@10", ">=", 0.4)
    assert floor.violation({"NDCG@10": 0.3}) == pytest.approx(0.4 - 0.3)
    latency = Constraint.parse("Latency_P95_ms <= 2e2")
    assert latency.bound == 200 and latency.violation({"Latency_P95_ms": 150.0}) == -50
    assert fp.violation({"OOS_FP_Rate": float("nan")}) == math.inf
    with pytest.raises(ConfigError, match="metric OOS_FP_Rate is not in the report"):
        fp.violation({"Primary_Metric_Score": 0.5})
    for bad in ("OOS_FP_Rate == 0.1", "<= 0.1", "OOS_FP_Rate <= ten"):
        with pytest.raises(ValueError, match="cannot parse constraint"):
            Constraint.parse(bad)


@pytest.mark.parametrize(
    ("sampler", "cls", "ignores"),
    [
        ("{type: tpe, seed: 1}", optuna.samplers.TPESampler, False),
        ("{type: random, seed: 1}", optuna.samplers.RandomSampler, True),
        ("{type: gp, seed: 1}", optuna.samplers.GPSampler, False),
        ("{type: nsgaii, seed: 1, population_size: 10}", optuna.samplers.NSGAIISampler, False),
        ("{type: cmaes, seed: 1}", optuna.samplers.CmaEsSampler, True),
        ("{type: qmc, seed: 1, qmc_type: halton}", optuna.samplers.QMCSampler, True),
    ],
)
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_samplers_build_and_flag_ignored_constraints(project: Path, sampler: str, cls: type, ignores: bool) -> None:
    exp = load_experiment(write_exp(project, MINIMAL + f"sampler: {sampler}\n"))
    assert isinstance(exp.sampler.create(), cls)
    assert exp.sampler.ignores_constraints is ignores
    assert bool(exp.warnings) is ignores
    no_constraints = load_experiment(write_exp(project, MINIMAL + f"sampler: {sampler}\nconstraints: []\n"))
    assert no_constraints.warnings == []


@pytest.mark.parametrize(
    ("pruner", "cls"),
    [
        ("{type: none}", optuna.pruners.NopPruner),
        ("{type: median, n_startup_trials: 2}", optuna.pruners.MedianPruner),
        ("{type: percentile, percentile: 10}", optuna.pruners.PercentilePruner),
        ("{type: wilcoxon, p_threshold: 0.05}", optuna.pruners.WilcoxonPruner),
    ],
)
def test_pruners_build(project: Path, pruner: str, cls: type) -> None:
    exp = load_experiment(write_exp(project, MINIMAL + f"pruner: {pruner}\n"))
    assert isinstance(exp.pruner.create(), cls)


def test_shortlist_inline_and_from_file_are_loaded_and_checked_against_the_space(project: Path) -> None:
    inline = load_experiment(
        write_exp(
            project,
            MINIMAL
            + """\
shortlist:
  - {name: a, fusion.method: rrf, fusion.rrf_k: 20}
  - {fusion.weights: {bm25: 3, dense: 1}}
""",
        )
    )
    assert [v.name for v in inline.variants] == ["a", None]
    assert inline.variants[1].values == {"fusion.weights": {"bm25": 3, "dense": 1}}
    space = load_space(inline.search_space, inline.target.config_files)
    assert space.params_for(inline.variants[1].values) == {"fusion.weights:bm25": pytest.approx(0.75)}
    (project / "experiments" / "short.yaml").write_text("- {name: b, fusion.method: linear}\n")
    from_file = load_experiment(write_exp(project, MINIMAL + "shortlist: short.yaml\n"))
    assert from_file.shortlist == project / "experiments" / "short.yaml"
    assert [(v.name, v.values) for v in from_file.variants] == [("b", {"fusion.method": "linear"})]
    (project / "experiments" / "short.yaml").write_text("fusion.method: linear\n")
    with pytest.raises(ConfigError, match="short.yaml: shortlist must be a list"):
        load_experiment(write_exp(project, MINIMAL + "shortlist: short.yaml\n"))


def test_labels_and_grade_maps(project: Path) -> None:
    exp = load_experiment(
        write_exp(
            project,
            MINIMAL.replace(
                "  queries: data/queries.jsonl",
                """\
  queries: data/queries.jsonl
  dataset_id: cran
  labels:
    - {path: data/qrels.txt, format: qrels, grade_map: {1: 3, 2: 2, 3: 1, 4: 0, -1: 0}}""",
            ),
        )
    )
    label = exp.dataset.labels[0]
    assert label.path == project / "experiments" / "data" / "qrels.txt"
    assert label.grade_map == {"1": 3, "2": 2, "3": 1, "4": 0, "-1": 0}
    with pytest.raises(ConfigError, match="grade_map 1: 5 is not a grade 0..3"):
        load_experiment(
            write_exp(
                project,
                MINIMAL.replace(
                    "  queries: data/queries.jsonl",
                    """\
  queries: data/queries.jsonl
  labels: [{path: q.txt, grade_map: {1: 5}}]""",
                ),
            )
        )


def test_docker_and_none_targets_need_their_sections(project: Path) -> None:
    none = load_experiment(
        write_exp(project, MINIMAL.replace("  process:", "  apply: none\n  none: {settle_s: 0.5}\n  process:"))
    )
    assert none.target.apply == "none" and none.target.none.settle_s == 0.5
    with pytest.raises(ConfigError, match="apply: docker needs a docker: section"):
        load_experiment(write_exp(project, MINIMAL.replace("  process:", "  apply: docker\n  process:")))


def test_shipped_reference_experiment_loads(tmp_path: Path) -> None:
    exp = load_experiment(REPO / "experiments" / "reference_process.yaml", check_paths=False)
    assert exp.project_root == REPO
    assert exp.target.config_files == [REPO / "backend" / "config.yaml"]
    assert exp.search_space == REPO / "search_space" / "reference_full.yaml"
    assert exp.target.apply == "process" and exp.target.port == "auto"
    assert exp.sampler.type == "tpe" and exp.sampler.seed == 42
    space = load_space(exp.search_space, exp.target.config_files)
    assert len(exp.variants) >= 3
    for variant in exp.variants:
        assert space.params_for(variant.values)  # every shortlist variant is representable


def test_holdout_is_off_unless_the_file_has_a_holdout_section(project: Path) -> None:
    assert load_experiment(write_exp(project, MINIMAL)).holdout.enabled is False
    held = load_experiment(write_exp(project, MINIMAL + "holdout: {seed: 7, fraction: 0.25}\n")).holdout
    assert (held.enabled, held.seed, held.fraction) == (True, 7, 0.25)
    off = load_experiment(write_exp(project, MINIMAL + "holdout: {enabled: false, seed: 7}\n")).holdout
    assert off.enabled is False


def test_validation_decides_the_holdout_and_the_cross_validation(project: Path) -> None:
    plain = load_experiment(write_exp(project, MINIMAL))
    assert (plain.validation, plain.holdout.enabled, plain.cross_validates) == (None, False, True)
    assert (plain.cv.folds, plain.cv.seed) == (5, 0)
    held = load_experiment(write_exp(project, MINIMAL + "holdout: {fraction: 0.25}\n"))
    assert (held.holdout.enabled, held.cross_validates) == (True, True)  # left out: both
    only = load_experiment(write_exp(project, MINIMAL + "validation: holdout\n"))
    assert (only.holdout.enabled, only.cross_validates) == (True, False)
    both = load_experiment(write_exp(project, MINIMAL + "validation: both\ncv: {folds: 4, seed: 2}\n"))
    assert (both.holdout.enabled, both.cross_validates, both.cv.folds, both.cv.seed) == (True, True, 4, 2)
    cv = load_experiment(write_exp(project, MINIMAL + "validation: cv\nholdout: {seed: 3}\n"))
    assert (cv.holdout.enabled, cv.holdout.seed, cv.cross_validates) == (False, 3, True)


def test_selection_is_best_unless_the_file_says_robust(project: Path) -> None:
    assert load_experiment(write_exp(project, MINIMAL)).selection == "best"
    assert load_experiment(write_exp(project, MINIMAL + "selection: robust\n")).selection == "robust"


def test_a_secondary_objective_is_read_and_what_it_cannot_do_is_refused_in_one_line(project: Path) -> None:
    assert load_experiment(write_exp(project, MINIMAL)).secondary_objective is None
    second = "secondary_objective: {metric: Latency_P95_ms, direction: minimize}\n"
    exp = load_experiment(write_exp(project, MINIMAL + second))
    assert exp.secondary_objective is not None
    assert (exp.secondary_objective.metric, exp.secondary_objective.maximize) == ("Latency_P95_ms", False)
    refused = {
        "secondary_objective: {metric: Primary_Metric_Score}\n": "metric Primary_Metric_Score is the objective's",
        second + "pruner: {type: median}\n": "with pruner median: Optuna cannot prune a multi-objective trial",
        second + "sampler: {type: cmaes}\n": "with sampler cmaes: it does not search two objectives",
    }
    for extra, needle in refused.items():
        with pytest.raises(ConfigError) as exc:
            load_experiment(write_exp(project, MINIMAL + extra))
        assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_the_shipped_pareto_experiment_loads_with_its_space(tmp_path: Path) -> None:
    exp = load_experiment(REPO / "experiments" / "demo_pareto.yaml", check_paths=False)
    assert exp.secondary_objective is not None and exp.secondary_objective.metric == "Latency_P95_ms"
    assert exp.search_space == REPO / "search_space" / "reference_pareto.yaml"
    space = load_space(exp.search_space, [REPO / "backend" / "config.yaml"])
    assert "rerank.depth" in space.distributions()
