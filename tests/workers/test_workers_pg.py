"""Several worker PROCESSES on one study in a real PostgreSQL.

The workers run tests/workers/cheap_worker.py (an objective that is a pure function of
its params and sleeps), so these tests check the multi-process machinery itself:
exactly-once trial execution, enqueue-once, and crash recovery by heartbeat + retry.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.workers import retries_of

from tuner.study.trial.attrs import ATTR_VARIANT, RECORDS, assignment_of, trial_attr

WORKER = Path(__file__).with_name("cheap_worker.py")


def start_worker(dsn, study, log, replica, n_trials, sleep, grace=2):
    cmd = [sys.executable, str(WORKER), "--storage", dsn, "--study", study, "--log", str(log),
           "--n-trials", str(n_trials), "--replica", str(replica), "--sleep", str(sleep),
           "--heartbeat", "1", "--grace", str(grace)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            pytest.fail(f"worker {p.pid} did not finish in {timeout} s; stderr:\n{err[-2000:]}")
        outs.append((p.returncode, err))
    return outs


def records(trial) -> dict:
    """The trial's records (tuner.* system attrs) by name."""
    return {name: value for name in RECORDS if (value := trial_attr(trial, name)) is not None}


def read_log(log: Path) -> list[tuple[str, int, int]]:
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        kind, number, pid, _replica = line.split()
        rows.append((kind, int(number), int(pid)))
    return rows


def test_three_workers_run_every_trial_exactly_once(pg_study, tmp_path):
    dsn, name = pg_study
    log = tmp_path / "trials.log"
    n_trials = 12
    procs = [start_worker(dsn, name, log, r, n_trials, sleep=0.3) for r in range(3)]
    for code, err in wait_all(procs, timeout=120):
        assert code == 0, err[-2000:]

    study = optuna.load_study(study_name=name, storage=dsn)
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials)
    # Workers stop on the study-wide count; one finishing late may add at most
    # (workers - 1) trials beyond it, never fewer.
    assert n_trials <= states[TrialState.COMPLETE] <= n_trials + 2
    assert set(states) == {TrialState.COMPLETE}
    starts = Counter(n for kind, n, _ in read_log(log) if kind == "start")
    assert sorted(starts) == sorted(t.number for t in trials)
    assert set(starts.values()) == {1}, "a trial number ran twice"
    assert len({pid for _, _, pid in read_log(log)}) >= 2, "the work was not shared between processes"
    variants = Counter(t.user_attrs.get(ATTR_VARIANT) for t in trials if t.user_attrs.get(ATTR_VARIANT))
    assert variants == {"baseline": 1, "shortlist-1": 1}, "baseline/shortlist must be queued exactly once"
    baseline = next(t for t in trials if t.user_attrs.get(ATTR_VARIANT) == "baseline")
    assert baseline.params == {"x": 0.5, "y": 1}


def test_sigkill_mid_trial_is_retried_by_another_worker(pg_study, tmp_path):
    dsn, name = pg_study
    log = tmp_path / "trials.log"
    n_trials = 14
    procs = [start_worker(dsn, name, log, r, n_trials, sleep=0.8) for r in range(3)]
    victim = procs[0]
    deadline = time.monotonic() + 60
    killed_trial = None
    while time.monotonic() < deadline and killed_trial is None:
        started = [n for kind, n, pid in read_log(log) if kind == "start" and pid == victim.pid]
        if started:
            time.sleep(0.2)  # well inside its 0.8 s trial
            os.kill(victim.pid, signal.SIGKILL)
            killed_trial = started[-1]
        time.sleep(0.05)
    assert killed_trial is not None, "the victim worker never started a trial"
    victim.wait(timeout=10)
    for code, err in wait_all(procs[1:], timeout=120):
        assert code == 0, err[-2000:]

    study = optuna.load_study(study_name=name, storage=dsn)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[killed_trial].state == TrialState.FAIL
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING], "a trial was left RUNNING"
    retries = retries_of(list(trials.values()))
    assert list(retries) == [killed_trial]
    (retry,) = retries[killed_trial]
    assert trials[retry].state == TrialState.COMPLETE
    assert trials[retry].params == trials[killed_trial].params
    assert trials[retry].user_attrs == trials[killed_trial].user_attrs
    # the records (tuner.* system attrs) too: the retry ran the killed trial's assignment
    assert records(trials[retry]) == records(trials[killed_trial]) != {}
    assert assignment_of(trials[retry]) == {"x": trials[retry].params["x"], "y": trials[retry].params["y"]}
    log_rows = read_log(log)
    retry_runner = {pid for kind, n, pid in log_rows if kind == "start" and n == retry}
    assert retry_runner and victim.pid not in retry_runner
    assert ("end", killed_trial, victim.pid) not in log_rows
    starts = Counter(n for kind, n, _ in log_rows if kind == "start")
    assert set(starts.values()) == {1}
    assert sum(t.state == TrialState.COMPLETE for t in trials.values()) >= n_trials
