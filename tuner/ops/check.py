"""The preflight of an experiment against its live backend (tuner.study.preflight holds the
checks; this module runs the batch they look at).

``static_preflight`` needs no traffic (template fields, constraints, the unjudged
queries policy); ``live_preflight`` starts the backend on the config as found, waits
for health, evaluates the query set (a seeded sample of a big one) and runs the batch
checks. `tuner check`, `run` and `worker` run both before the first trial.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.errors import TunerError
from tuner.study.preflight import (
    Finding,
    PreflightReport,
    check_batch,
    check_oos_movable,
    sample_queries,
    static_checks,
)

if TYPE_CHECKING:
    from tuner.evaluation.client import Abort
    from tuner.study.stop import StopFlag
    from tuner.study.wiring import Prepared
    from tuner.targets.base import Target
    from tuner.targets.reaper import PidRecordingTarget


def static_preflight(prepared: Prepared, *, skip: bool = False) -> PreflightReport:
    """The checks that need no backend."""
    exp = prepared.experiment
    report = PreflightReport(n_total=len(prepared.queries), skipped=skip)
    report.extend(
        static_checks(
            exp.evaluation,
            prepared.queries,
            exp.constraints,
            unjudged_note=prepared.dataset_note,
            unjudged_policy=exp.dataset.unjudged_queries,
        )
    )
    problem = roundtrip_problem(prepared)
    if problem is not None:
        report.extend([Finding("config_roundtrip", "stop", problem)])
    return report


def roundtrip_problem(prepared: Prepared) -> str | None:
    """Why the tuner cannot write the config files back (every trial would FAIL on it),
    or None: the config as found is rendered through the search space's edits, which
    runs the same parse-back check as every trial's write."""
    from tuner.errors import ConfigError

    space, patcher = prepared.space, prepared.patcher
    if prepared.request_document is not None:
        return None  # channel: request writes no file
    try:
        # verbatim=False: through the round trip although no value changes
        patcher.render(space.edits(space.current_assignment(patcher.documents())), verbatim=False)
    except ConfigError as exc:
        import re

        text = str(exc)
        tag = re.search(r"tag '([^']+)'", text)
        where = text.split(":", 1)[0]
        what = f"its YAML tag {tag.group(1)} has no constructor" if tag else text.splitlines()[0]
        return (
            f"{where}: the tuner cannot write this config back ({what}); every trial would fail on it: "
            "replace the custom tag, e.g. with a plain value or an environment variable the backend reads"
        )
    return None


def live_preflight(
    prepared: Prepared,
    report: PreflightReport,
    *,
    start: Callable[[], object],
    full: bool = False,
    seed: int = 0,
    abort: Abort | None = None,
) -> PreflightReport:
    """Evaluate the config as found and add the batch checks to ``report``.

    ``start`` brings the backend up on the config as found and waits until healthy.
    ``abort`` ends the batches (the evaluation, fusion replay's explained one) as it ends
    a trial's: BatchAborted with its reason (tuner.evaluation.batch).
    """
    from tuner.evaluation import run_batch
    from tuner.evaluation.probe import fetch_raw

    exp = prepared.experiment
    queries, used_seed = (prepared.queries, None) if full else sample_queries(prepared.queries, seed=seed)
    start()
    result = run_batch(exp.evaluation, queries, prepared.qrels, order_seed=seed, abort=abort)
    report.n_checked, report.sample_seed = len(queries), used_seed
    if used_seed is not None:
        report.findings.insert(
            0,
            Finding(
                "sample",
                "info",
                f"checked a seeded sample of {len(queries)} of {len(prepared.queries)} queries "
                f"(seed {used_seed}); `tuner check --full` checks every query",
            ),
        )
    report.extend(
        check_batch(
            result,
            exp.evaluation,
            gate_values=gate_values(prepared),
            # only a solved confidence gate undoes the handoffs of the config as found
            gates_solved=any(g.role == "confidence" for g in prepared.gates.values()),
            raw_response=lambda qid: fetch_raw(exp.evaluation, queries[qid]),
        )
    )
    # an OOS constraint no trial can move would call every trial feasible
    report.extend(
        check_oos_movable(
            result,
            exp.constraints,
            tuned_keys=[p.path for p in prepared.space.params],
            gates=list(prepared.gates.values()),
        )
    )
    if prepared.replay is not None:
        report.extend([replay_finding(prepared, queries, seed, abort=abort)])
    return report


def replay_finding(prepared: Prepared, queries: Any, seed: int, *, abort: Abort | None = None) -> Finding:
    """Fusion replay checked before the first trial: the queries run once, explained, on
    the config as found, and every answer replayed at the setting the backend served
    (tuner.study.trial.replay_measure.served_problem). A stop when it cannot be replayed."""
    from tuner.errors import TunerError
    from tuner.evaluation.client import BatchAborted
    from tuner.evaluation.explain_batch import run_explained
    from tuner.study.trial.replay_measure import answer_reader, served_problem

    exp, plan = prepared.experiment, prepared.replay
    assert plan is not None, "replay_finding is for an experiment with replay:"
    try:
        batch = run_explained(
            exp.evaluation,
            queries,
            prepared.qrels,
            request_fields=plan.config.request,
            reader=answer_reader(plan, exp.evaluation, prepared.request_document),
            order_seed=seed,
            abort=abort,
        )
    except BatchAborted:
        raise  # a stop or a dead backend: no finding about the config
    except TunerError as exc:
        return Finding("replay", "stop", f"fusion replay: {str(exc).splitlines()[0]}")
    problem = served_problem(batch, exp.evaluation.top_k, plan)
    if problem is not None:
        return Finding("replay", "stop", problem)
    grid = plan.grid({})
    if grid is None:
        how = f"scores {plan.config.max_settings} settings (TPE)"
    elif plan.config.bound and prepared.gates and exp.objective.maximize:
        how = f"bounds a grid of {len(grid)} settings, scores exactly those that can be among the best"
    else:
        how = f"scores a grid of {len(grid)} settings"
    return Finding(
        "replay",
        "info",
        f"fusion replay: {len(batch.responses)} explained answers replay exactly at the "
        f"setting served; each trial {how}, then serves the best "
        f"{plan.config.verify_top} live",
    )


def gate_values(prepared: Prepared) -> dict[str, Any]:
    """Config key -> value as found, of the search space's post-retrieval gates."""
    space = prepared.space
    names = sorted(space.post_retrieval)
    if not names:
        return {}
    current = space.current_assignment(prepared.found_documents())
    return {space[n].path: current[n] for n in names if n in current}


def start_on_files(
    prepared: Prepared,
    target: Target | PidRecordingTarget,
    wait: Callable[[], Any],
    *,
    note: Callable[[str], None] = lambda text: None,
    fresh: bool = False,
) -> None:
    """Start the backend so that it serves the config files as found before anything is
    measured: a backend already up before the start (a compose service's containers) is
    restarted when a restore journal was just replayed, or when its health answer does
    not prove (``target.reload.fingerprint``) that it serves the file on disk -- it may
    still serve a killed run's trial config. ``fresh``: the caller has just brought the
    backend up on the files (a worker's compose replica, `up` after its leftovers ended)."""
    from tuner.targets.reload import serves_files

    up = [] if fresh else target.up_before_start()
    target.start()
    health = wait()
    if not up:
        return
    exp = prepared.experiment
    if prepared.replayed is None and serves_files(health, exp.target.reload, exp.target.config_files):
        return
    why = (
        "a restore journal was replayed"
        if prepared.replayed is not None
        else "nothing proves it serves the config files as found (target.reload.fingerprint)"
    )
    note(
        f"restarting the backend ({', '.join(up)} was already up) before the preflight: {why}, and it may still "
        "serve a killed run's trial config"
    )
    target.restart()
    wait()


def preflight_on_target(
    prepared: Prepared,
    report: PreflightReport,
    target: Target | PidRecordingTarget,
    wait: Callable[[], object],
    *,
    note: Callable[[str], None] = lambda text: None,
    full: bool = False,
    stop: StopFlag | None = None,
    fresh: bool = False,
) -> PreflightReport:
    """``live_preflight`` on a `Target` (started here, serving the files as found:
    `start_on_files`; ``fresh`` as there): every finding goes to ``note``;
    a stop finding raises PreflightError after the backend is stopped again.

    Its batch is aborted as a trial's is (tuner.study.wiring.build_runner): at once when
    the backend dies, and when ``stop`` is set (SIGTERM, Ctrl-C) with no grace, since
    no trial will use its numbers. A stop request, whenever it came, returns the report
    as far as it got with the backend stopped; the caller sees ``stop.is_set()`` and
    starts no trial."""
    from tuner.evaluation.batch import any_abort

    def stop_reason() -> str | None:
        return stop.reason if stop is not None and stop.is_set() else None

    note("preflight: evaluating the config as found")
    try:
        live_preflight(
            prepared,
            report,
            full=full,
            start=lambda: start_on_files(prepared, target, wait, note=note, fresh=fresh),
            abort=any_abort(target.failure, stop_reason),
        )
    except TunerError as exc:
        target.close()
        if stop_reason() is None:
            raise
        # the stop (or, as it came, a query's failure) ended the batch: a stop, not a finding
        note(
            f"preflight: {str(exc).splitlines()[0]}; stopped before the first trial, the config files were not touched"
        )
        return report
    except BaseException:
        target.close()
        raise
    for finding in report.findings:
        note(finding.note)
    if stop_reason() is not None:  # it came as the batch ended: the run stops all the same
        target.close()
        note(f"preflight: {stop_reason()}; stopped before the first trial, the config files were not touched")
        return report
    try:
        report.raise_for_stops()
    except BaseException:
        target.close()
        raise
    return report


def check_experiment(experiment: Any, *, full: bool = False, seed: int = 0) -> tuple[PreflightReport, list[str]]:
    """`tuner check`: every check on the config as found, on a backend started for it
    (and stopped after), holding the config locks (tuner.study.storage.locks) while the backend runs.
    Never replays or touches a restore journal: one that exists belongs to a killed
    run, which the next `tuner run` replays. Returns the
    report and the experiment's own warnings (space vs config, sampler)."""
    from tuner.config.journal import pending, recover_hint
    from tuner.study.wiring import prepare
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    experiment = experiment.bind_port()
    prepared = prepare(experiment, recover_journal=False)
    report = static_preflight(prepared)
    found = pending(experiment.journal_path)
    if found is not None:
        report.findings.insert(0, Finding("journal", "warn", found.line(recover_hint(experiment.source))))
    if any(f.code == "template_field" for f in report.stops):
        return report, prepared.warnings  # every request would fail: nothing to send
    from tuner.study.storage.file_locks import config_locks, url_locks

    # The backend it starts reads the config files: not while a run has a trial's values
    # in them (LockHeld names the run), and no run patches them while it measures
    # (channel: http: nor the config document).
    with (
        config_locks(experiment.target.config_files, command="tuner check"),
        url_locks(experiment.target.config_urls, command="tuner check"),
    ):
        target = make_target(experiment.target, experiment.state_dir)
        try:
            live_preflight(
                prepared,
                report,
                full=full,
                seed=seed,
                start=lambda: (target.start(), wait_target_healthy(experiment.target.health, target)),
            )
        finally:
            target.close()
    return report, prepared.warnings
