"""What a `TrialRunner` (tuner.study.trial.runner) is built from: the small interfaces of its
collaborators (search space, config writer, declared data inputs, batch evaluator).
The objective and constraints it scores a trial by are the experiment's own
(tuner.config.objective.Objective, Constraint)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import optuna

from tuner.data.inputs import InputsFingerprint

OnResult = Callable[[str, Mapping[str, Any]], None]


class SpaceLike(Protocol):
    """The search space (tuner.config.space.searchspace.SearchSpace): the trial's values.
    ``skip_post_retrieval`` / ``skip`` leave out the params a trial solves (its gates,
    its replayed fusion params); a test fake without gates or replay may ignore them."""

    def suggest(
        self, trial: optuna.Trial, *, skip_post_retrieval: bool = False, skip: Collection[str] = ()
    ) -> Mapping[str, Any]: ...


class InputsLike(Protocol):
    """``target.inputs`` (tuner.data.inputs.InputsWatch): the declared data files' fingerprint now."""

    def current(self) -> InputsFingerprint: ...


class ConfigWriter(Protocol):
    """Renders an assignment into config text(s) and writes them (atomic, journaled).

    A writer that reads the config files may also offer ``as_found(assignment) ->
    assignment``: the file's own values where the assignment leaves a key unchanged
    (tuner.study.wiring.PatcherWriter); the trial runner then records and writes those.
    Without it (test fakes) the suggested values are used as they are."""

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]: ...

    def write(self, texts: Mapping[Path, str]) -> None: ...


class EvalOutcome(Protocol):
    """What the study needs from a batch evaluation result."""

    metrics: Mapping[str, float]


class BatchEvaluator(Protocol):
    """The batch evaluation of the live backend plus its reports.

    The three fingerprints (query set content, labels, evaluation settings) are part
    of the result-cache key.
    """

    dataset_hash: str
    labels_fingerprint: str
    spec_fingerprint: str

    @property
    def last_search_seconds(self) -> float:
        """Seconds from the first request sent to the last answer read, of the last evaluate()
        (on this thread: parallel trials each read their own)."""
        ...

    def evaluate(self, *, order_seed: int, on_result: OnResult | None) -> EvalOutcome:
        """Evaluate every query; ``on_result(query_id, per_query_row)`` after each answer.
        An exception raised by the callback (optuna.TrialPruned) stops the batch."""

    def report_paths(self, result: EvalOutcome, out_dir: Path, *, detail: str = "full") -> Mapping[str, Path]:
        """The files `write_reports` will write for ``result`` at ``detail`` (kind -> path)."""

    def write_reports(
        self,
        result: EvalOutcome,
        out_dir: Path,
        *,
        context: Mapping[str, Any],
        config_snapshot: str,
        detail: str = "full",
        pr_curve: str | None = None,
    ) -> Mapping[str, Path]:
        """``detail``: "slim" (scorecard, per-query metrics, summary) or "full" (also every
        query's top-k snapshot, the unjudged hits and the PR-curve PNG); ``pr_curve``:
        tuner.report.writer.pr_curve_action ("keep": a superseded best keeps its curve)."""

    def close(self) -> None:
        """End what the evaluator started (its report helper process)."""
