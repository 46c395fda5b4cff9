"""A trial's MLflow record (`TrialRecord`) from what the trial produced, built one way
for both of its paths:

- live: `tracking_record` of the `TrialOutcome`, on the bookkeeper after ``tell``
  (tuner.study.trial.records);
- after a SIGKILL: `record_from_trial` of the finished Optuna trial. Everything the
  live record holds is on the trial before ``tell`` (the assignment, metrics, report
  paths and phase timings as records; feasibility, cache hit, fail reason, early stop
  and replay as user attrs; the constraints), so a trial the killed process had told
  but not yet logged gets the same params, metrics, tags, run name and verdict. Only
  its files may be missing: the config snapshot and report files are written by the
  same bookkeeping, and the run's description says when they were lost.

`OptunaRecords` hands the finished trials of a study to `Tracker.close_stale_runs` as
plain data (the report layer imports no Optuna), building each record only when it is
asked for; `stale_runs_note` is the one line a start prints about what it closed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.config.objective import Constraint
from tuner.report.tracker import TAG_CACHE_HIT, StaleRuns, Tracker, TrialRecord
from tuner.study.notes import Links, trial_note
from tuner.study.storage.queue import counts_toward_total
from tuner.study.trial.attrs import (
    ATTR_CACHE_HIT,
    ATTR_CACHE_NOTE,
    ATTR_EARLY_STOP,
    ATTR_FAIL_REASON,
    ATTR_GATES_MOVED,
    ATTR_MLFLOW_RUN,
    ATTR_PHASES,
    ATTR_REPLAY,
    assignment_of,
    metrics_of,
    named_constraints,
    reports_of,
    trial_attr,
)
from tuner.study.trial.outcome import SOLVED_PREFIX, FinishedState, TrialOutcome

TAG_CACHE_NOTE = "tuner.cache_note"
TAG_RECOVERED = "tuner.recovered"  # "optuna-record": logged from the Optuna trial after a killed run
RECOVERED = "optuna-record"


def tracking_record(
    out: TrialOutcome, named: Mapping[str, str], *, constraints: Sequence[Constraint], note: str | None = None
) -> TrialRecord:
    """The MLflow record of ``out``: its assignment as params, its metrics with the
    objective, feasibility and each constraint's violation (``violation.<metric>``),
    the fusion replay's counts, the verdict tags; ``named`` (config name -> text) as
    ``config/<file>`` artifacts; ``constraints`` (with ``name`` and ``metric``) name
    the violations; ``note`` is the run's description."""
    metrics = dict(out.metrics)
    if out.value is not None:
        metrics["objective"] = out.value
    if out.state == "COMPLETE":
        metrics["feasible"] = 1.0 if out.feasible else 0.0
    by_name = {c.name: c for c in constraints}
    for name, violation in out.constraints.items():
        metric = getattr(by_name.get(name), "metric", None) or name.split()[0]
        metrics[f"violation.{metric}"] = violation
    if out.replay:  # fusion replay: how much was scored, and how far live was from replayed
        metrics["replay.settings"] = float(out.replay.get("settings", out.replay["scored"]))
        metrics["replay.settings_scored"] = float(out.replay["scored"])
        metrics["replay.max_live_gap"] = max(
            (abs(v["live"] - v["replayed"]) for v in out.replay["verified"]), default=0.0
        )
    tags = {TAG_CACHE_HIT: str(out.cache_hit).lower(), "tuner.feasible": str(out.feasible).lower()}
    if out.cache_note:
        tags[TAG_CACHE_NOTE] = out.cache_note
    if out.early_stop:
        tags["tuner.early_stop"] = out.early_stop
    return TrialRecord(
        number=out.number,
        state=out.state,
        params=out.assignment,
        metrics=metrics,
        config_texts={f"config/{Path(n).name}": t for n, t in named.items()},
        reports={k: Path(v) for k, v in out.reports.items()},
        fail_reason=out.fail_reason,
        tags=tags,
        value=out.value,
        feasible=out.feasible if out.state == "COMPLETE" else None,
        duration_s=out.duration_s,
        summary=note,  # the run's description: the trial note (links to the Optuna trial page included)
    )


_FINISHED: dict[str, FinishedState] = {"COMPLETE": "COMPLETE", "FAIL": "FAIL", "PRUNED": "PRUNED"}


def outcome_of(trial: FrozenTrial) -> TrialOutcome:
    """The `TrialOutcome` a finished trial was told with, read back from its record."""
    state = _FINISHED.get(trial.state.name)
    if state is None:
        raise ValueError(f"trial #{trial.number} is {trial.state.name}: only a finished trial has an outcome")
    complete = trial.state == TrialState.COMPLETE
    return TrialOutcome(
        number=trial.number,
        state=state,
        # a PRUNED trial's Optuna value is its last intermediate value, not a score
        value=float(trial.values[0]) if complete and trial.values else None,
        assignment=assignment_of(trial),
        metrics={k: float(v) for k, v in metrics_of(trial).items() if isinstance(v, (int, float))},
        constraints=named_constraints(trial.constraints or {}),
        fail_reason=trial.user_attrs.get(ATTR_FAIL_REASON),
        cache_hit=bool(trial.user_attrs.get(ATTR_CACHE_HIT, False)),
        cache_note=trial_attr(trial, ATTR_CACHE_NOTE),
        early_stop=trial.user_attrs.get(ATTR_EARLY_STOP),
        reports=reports_of(trial),
        phase_seconds=dict(trial_attr(trial, ATTR_PHASES) or {}),
        replay=trial_attr(trial, ATTR_REPLAY),
        gates_moved=trial_attr(trial, ATTR_GATES_MOVED),
    )


def record_from_trial(
    trial: FrozenTrial,
    *,
    objective: str,
    constraints: Sequence[Constraint],
    config_texts: Mapping[str, str],
    links: Links | None = None,
) -> TrialRecord:
    """The record the live path would have logged for finished ``trial`` (see the module
    docstring), with ``config_texts`` (config name -> the snapshot in its trial folder,
    {} when it was never written). Report files that are not on disk are left out and
    the description says they were lost with the killed process."""
    out = outcome_of(trial)
    solved = {n: v for n, v in out.assignment.items() if SOLVED_PREFIX + n in out.metrics}
    note = trial_note(
        number=out.number,
        state=out.state,
        value=out.value,
        objective=objective,
        feasible=out.feasible,
        constraints=out.constraints,
        metrics=out.metrics,
        solved=solved,
        early_stop=out.early_stop,
        fail_reason=out.fail_reason,
        links={"Optuna trial page": links.trial(out.number)} if links else {},
        gates_moved=out.gates_moved,
    )
    lost = sorted(Path(p).name for p in out.reports.values() if not Path(p).is_file())
    out.reports = {k: p for k, p in out.reports.items() if Path(p).is_file()}
    # a COMPLETE trial always has a config snapshot; one that failed early never had one
    note += "\n" + recovery_line(lost, snapshot_lost=out.state == "COMPLETE" and not config_texts)
    record = tracking_record(out, config_texts, constraints=constraints, note=note)
    started = trial.datetime_start
    run_id = trial.user_attrs.get(ATTR_MLFLOW_RUN)
    return TrialRecord(
        **{
            **record.__dict__,
            "tags": {**record.tags, TAG_RECOVERED: RECOVERED},
            "started_ms": round(started.timestamp() * 1000) if started is not None else None,
            "run_id": run_id if isinstance(run_id, str) and run_id else None,
        }
    )


def recovery_line(lost: Sequence[str], *, snapshot_lost: bool) -> str:
    """The last line of the description of a run logged from the Optuna record:
    ``lost`` names the report files that were never written."""
    line = (
        "Logged from the Optuna trial at the next start: the process that ran this trial was killed after "
        "Optuna recorded it and before it logged it here."
    )
    gone = ([f"report files ({', '.join(lost)})"] if lost else []) + (["config snapshot"] if snapshot_lost else [])
    if gone:
        line += (
            f" Its {' and its '.join(gone)} {'were' if lost or len(gone) > 1 else 'was'} lost with that "
            "process; the params and metrics here are Optuna's record."
        )
    return line


class OptunaRecords(Mapping[int, TrialRecord]):
    """The trials of a study that ran to the end (COMPLETE, PRUNED, or FAIL for a reason
    of their own: `counts_toward_total`), by number; each `TrialRecord` is built when it
    is first asked for. Its config snapshot is read from the trial's folder
    (``<trials dir>/<number>/``, the first of ``trials_dirs`` that has it: workers keep
    one per replica) under one of ``config_names`` or a replica's copy of it
    (``config.replica-2.yaml``). Interrupted trials are not here: their runs fail as
    interrupted."""

    def __init__(
        self,
        trials: Sequence[FrozenTrial],
        *,
        trials_dirs: Sequence[Path],
        config_names: Sequence[str],
        objective: str,
        constraints: Sequence[Constraint],
        links: Links | None = None,
    ) -> None:
        self._trials = {t.number: t for t in trials if t.state.is_finished() and counts_toward_total(t)}
        self._dirs = list(trials_dirs)
        self._names = [Path(n).name for n in config_names]
        self._objective, self._constraints, self._links = objective, constraints, links
        self._built: dict[int, TrialRecord] = {}

    def __getitem__(self, number: int) -> TrialRecord:
        if number not in self._built:
            self._built[number] = record_from_trial(
                self._trials[number],
                objective=self._objective,
                constraints=self._constraints,
                config_texts=self._snapshot(number),
                links=self._links,
            )
        return self._built[number]

    def _snapshot(self, number: int) -> dict[str, str]:
        for folder in (d / str(number) for d in self._dirs):
            texts = {}
            for name in self._names:
                stem, suffix = Path(name).stem, Path(name).suffix
                for path in [folder / name, *sorted(folder.glob(f"{stem}.replica-*{suffix}"))]:
                    try:
                        texts[path.name] = path.read_text(encoding="utf-8")
                        break
                    except (OSError, UnicodeDecodeError):
                        continue  # not written: the bookkeeping that writes it was lost with the process
            if texts:
                return texts
        return {}

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._trials))

    def __len__(self) -> int:
        return len(self._trials)


def close_killed_runs(
    tracker: Tracker,
    study: Any,
    *,
    trials_dirs: Sequence[Path],
    config_names: Sequence[str],
    objective: str,
    constraints: Sequence[Constraint],
    links: Links | None = None,
    live_trials: Collection[int] = (),
    killed: str = "a killed run",
) -> str | None:
    """`Tracker.close_stale_runs` with the records of ``study``'s finished trials
    (`OptunaRecords`); the line to print about it (`stale_runs_note`), None when it
    closed nothing."""
    records = OptunaRecords(
        study.get_trials(deepcopy=False),
        trials_dirs=trials_dirs,
        config_names=config_names,
        objective=objective,
        constraints=constraints,
        links=links,
    )
    return stale_runs_note(
        tracker.close_stale_runs(study.study_name, live_trials=live_trials, finished=records), killed=killed
    )


def stale_runs_note(closed: StaleRuns, *, killed: str = "a killed run") -> str | None:
    """One line on what `Tracker.close_stale_runs` did (None when it did nothing), e.g.
    ``MLflow runs left open by a killed run: trials [46, 47] COMPLETE, [48] PRUNED completed from the
    Optuna record; [49] FAILED as interrupted (Optuna had not finished them)``."""
    parts = []
    if closed.recorded:
        parts.append(f"trials {_by_state(closed.recorded)} completed from the Optuna record")
    if closed.interrupted:
        parts.append(f"{list(closed.interrupted)} FAILED as interrupted (Optuna had not finished them)")
    if closed.created:
        parts.append(f"trials {_by_state(closed.created)} had no MLflow run: made from the Optuna record")
    if not parts:
        return None
    return f"MLflow runs left open by {killed}: " + "; ".join(parts)


def _by_state(states: Mapping[int, str]) -> str:
    order = ("COMPLETE", "PRUNED", "FAIL")
    groups = {s: sorted(n for n, st in states.items() if st == s) for s in order}
    return ", ".join(f"{numbers} {state}" for state, numbers in groups.items() if numbers)
