"""Holdout validation against the live backend: `tuner validate EXPERIMENT`.

Re-evaluates the study's baseline and its best feasible trial (or ``--trial N``) on the
holdout queries only -- queries the sampler never saw when the study tuned on the tune
split -- and writes the paired comparison (tuner.evaluation.holdout.holdout_report) as JSON and
Markdown next to the study report. Each config is written with the restore journal,
the backend restarted and checked healthy, and the original config is always put
back (and the backend restarted on it) afterwards, as `tuner apply` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import StudyError
from tuner.evaluation.holdout import (
    ATTR_HOLDOUT,
    HoldoutConfig,
    HoldoutReport,
    Split,
    check_same_split,
    holdout_report,
    split_queries,
)
from tuner.files import atomic_write_text
from tuner.metrics.significance import Test
from tuner.optuna_adapter import FAILED_TRIAL
from tuner.study.trial.attrs import ATTR_VARIANT, assignment_of

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment

REPORT_JSON = "holdout.json"
REPORT_MD = "holdout.md"


@dataclass
class HoldoutRun:
    report: HoldoutReport
    split: Split
    baseline_trial: int
    best_trial: int
    json_path: Path
    markdown_path: Path


def holdout_config_of(experiment: Any) -> HoldoutConfig:
    """The experiment's ``holdout:`` section, or the defaults while experiment files have none."""
    config = getattr(experiment, "holdout", None)
    return config if isinstance(config, HoldoutConfig) else HoldoutConfig()


def validate_holdout(experiment: Any, **kwargs: Any) -> HoldoutRun:
    """`_validate_holdout` under the study and config locks (tuner.study.storage.locks): it patches the
    config and may replay a restore journal, so it needs the same rights as a run."""
    from tuner.study.storage.locks import patch_rights

    with patch_rights(
        experiment.storage,
        experiment.study,
        experiment.target.config_files,
        mode="exclusive",
        command="tuner validate",
        urls=experiment.target.config_urls,
    ) as lease:
        on_step = kwargs.get("on_step") or (lambda step: None)
        for line in lease.notes:
            on_step(line)
        return _validate_holdout(experiment, **kwargs)


def _validate_holdout(
    experiment: Experiment,
    *,
    holdout: HoldoutConfig | None = None,
    trial_number: int | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
    test: Test = "permutation",
    out_dir: Path | None = None,
    on_step: Callable[[str], None] = lambda step: None,
) -> HoldoutRun:
    from tuner.study.feasibility import pick_trial
    from tuner.study.query_scores import trial_chooser
    from tuner.study.storage.study_storage import load_study
    from tuner.study.trial.live import LiveEvaluator
    from tuner.study.wiring import prepare
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    holdout = holdout or holdout_config_of(experiment)
    study = load_study(experiment)
    maximize = experiment.objective.maximize
    best = pick_trial(
        study,
        trial_number,
        maximize=maximize,
        choose=trial_chooser(experiment.objective, experiment.constraints, experiment.selection),
    )
    baseline = next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(ATTR_VARIANT) == "baseline" and FAILED_TRIAL not in t.system_attrs
        ),
        None,
    )
    if baseline is None:
        raise StudyError(f"study {experiment.study!r} has no baseline trial; set baseline: true and run it first")
    exp = experiment.bind_port()
    prepared = prepare(exp)
    if prepared.replayed:
        on_step(prepared.replayed)
    if prepared.patcher.journal is not None:
        prepared.patcher.journal.owner = f"tuner validate of study {experiment.study!r}"
    for line in prepared.patcher.notes:
        on_step(line)
    all_queries = prepared.all_queries if prepared.all_queries is not None else prepared.queries
    split = split_queries(all_queries, holdout)
    check_same_split(study.user_attrs.get(ATTR_HOLDOUT), split)
    queries = all_queries.subset(query_ids=split.holdout)
    evaluator = LiveEvaluator(exp, queries, prepared.qrels, prepared.labels_fingerprint)
    target = make_target(exp.target, exp.state_dir)
    evaluator.abort = target.failure  # a backend that dies mid-batch ends it at once
    health = exp.target.health
    patcher, space = prepared.patcher, prepared.space

    def restart_and_wait() -> None:
        target.restart()
        wait_target_healthy(health, target)

    results: dict[str, Any] = {}
    try:
        for side, trial in (("baseline", baseline), ("best", best)):
            assignment = assignment_of(trial) or space.suggest(trial)
            on_step(f"{side}: trial #{trial.number} on {len(queries)} holdout queries")
            patcher.write(patcher.render(space.edits(assignment)))
            restart_and_wait()
            results[side] = evaluator.evaluate(order_seed=0, on_result=lambda qid, row: None)
    finally:
        on_step("restoring the original config")
        patcher.restore()
        try:
            restart_and_wait()
        finally:
            target.close()
    report = holdout_report(results["baseline"], results["best"], n_resamples=n_resamples, seed=seed, test=test)
    folder = out_dir or exp.state_dir / "reports" / exp.study
    data = {
        "study": exp.study,
        "baseline_trial": baseline.number,
        "best_trial": best.number,
        "split": {k: v for k, v in split.to_dict().items() if k not in ("tune", "holdout")},
        "holdout_query_ids": list(split.holdout),
        **report.to_dict(),
    }
    json_path = atomic_write_text(folder / REPORT_JSON, json.dumps(data, indent=2, default=float) + "\n")
    header = (
        f"# Holdout validation of study {exp.study}\n\nBaseline trial #{baseline.number} vs best feasible "
        f"trial #{best.number}; split seed {split.seed}, holdout fraction {split.fraction:.2f}.\n\n"
    )
    md_path = atomic_write_text(folder / REPORT_MD, header + report.to_markdown())
    return HoldoutRun(report, split, baseline.number, best.number, json_path, md_path)
