"""The fault classes of the HTTP config channel (``target.channel: http``), on the real
reference backend serving its config at /admin/config (started by the test, outside
the project: the engine runs elsewhere and outlives a killed tuner).

- ``sigkill-runner-http``: `tuner run` is SIGKILLed while the backend serves a trial's
  document; the next `tuner run` replays the journal (the original PUT back, read back)
  before anything else and completes the study; the served document ends byte-identical
  to the one found (GET bodies compared);
- ``http-put-refused``: the server refuses a trial's PUT (422, the backend's own
  validation): the trial FAILs with the server's detail quoted in one line, the study
  goes on, the served document is unchanged;
- ``http-readback-differs``: the backend (a test-only fault switch) stores a PUT without
  one key's new value: the trial whose document it altered FAILs with the difference
  named, nothing is recorded as its score;
- ``two-runs-one-url``: a second run (another study, another state dir) on the URL a
  running study writes is refused at once with one line naming the holder; the first
  run, then stopped by SIGTERM, puts the original back.

Each records its damage in the fault log like the file channel's classes: a trial
LOST (RUNNING after every process ended, or a gap), the document LEFT PATCHED (the
served body differs from the one found), an ORPHAN (a live process naming the project).
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.backend import RunningBackend
from support.demo_data import copy_demo_subset
from support.http_config import external_backend, http_overrides, served_document
from support.reference_experiment import copy_backend_config, write_reference_experiment

from faults.faultlib import DEADLINE_S, Damage, FaultLog, Running, all_gone, assert_survived, judge, wait_until
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_VARIANT

pytestmark = [pytest.mark.slow, pytest.mark.integration]
N_IN_SCOPE = 30
TUNER = str(Path(sys.executable).with_name("tuner"))
KEEP_ON_PUT = "FUSION_BACKEND_TEST_FAULT_KEEP_ON_PUT"  # backend/fusion_backend/app.py's test-only fault
SPACE = "params:\n  fusion.rrf_k: {type: int, low: -1, high: 80}\n"


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_demo_subset(tmp_path_factory.mktemp("demo-http-faults") / "data", N_IN_SCOPE)


def engine(tmp_path: Path, data: Path, env: dict[str, str] | None = None) -> Iterator[RunningBackend]:
    home = tmp_path / "engine"
    home.mkdir()
    (home / "data").symlink_to(data, target_is_directory=True)
    with external_backend(copy_backend_config(home), env=env) as backend:
        yield backend


@pytest.fixture
def backend(tmp_path: Path, demo_data: Path) -> Iterator[RunningBackend]:
    yield from engine(tmp_path, demo_data)


def project(root: Path, data: Path, backend: RunningBackend, *, study: str, n_trials: int,
            variants: list[dict[str, Any]] = (), state_dir: str = "state") -> Path:  # type: ignore[assignment]
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "data").exists():
        (root / "data").symlink_to(data, target_is_directory=True)
    (root / "space.yaml").write_text(SPACE)
    (root / f"{study}-shortlist.json").write_text(json.dumps(list(variants)))
    path = write_reference_experiment(root, study=study, n_trials=n_trials, storage=f"sqlite:///{root / 'optuna.db'}",
                                      shortlist=f"{study}-shortlist.json", sampler={"type": "random", "seed": 3},
                                      search_space=str(root / "space.yaml"), state_dir=state_dir,
                                      **http_overrides(backend.url))
    return path.rename(root / f"{study}.yaml")


def tuner(root: Path, *args: str) -> Running:
    return Running([TUNER, *args], root, root / f"tuner-{args[0]}-{len(list(root.glob('tuner-*.out')))}")


def trials(root: Path, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{root / 'optuna.db'}").get_trials()


def damage(root: Path, study: str, backend: RunningBackend, original: bytes) -> Damage:
    found = trials(root, study)
    numbers = sorted(t.number for t in found)
    lost = [f"trial #{t.number} {t.state.name}" for t in found if t.state.name == "RUNNING"]
    lost += [f"no record of trial #{n}" for n in range(len(numbers)) if n not in numbers]
    patched = [] if served_document(backend.url) == original else [f"{backend.url}/admin/config serves another body"]
    orphans = [] if all_gone(str(root)) else [f"a process naming {root}"]
    return Damage(lost=lost, patched=patched, orphans=orphans)


def by_variant(root: Path, study: str) -> dict[str, optuna.trial.FrozenTrial]:
    return {str(t.user_attrs.get(ATTR_VARIANT)): t for t in trials(root, study) if t.user_attrs.get(ATTR_VARIANT)}


def test_sigkill_mid_trial_the_next_start_restores_the_served_document(tmp_path: Path, demo_data: Path,
                                                                       backend: RunningBackend,
                                                                       fault_log: FaultLog) -> None:
    root = tmp_path / "proj"
    exp = project(root, demo_data, backend, study="killed", n_trials=10,
                  variants=[{"name": f"k{k}", "fusion.rrf_k": k} for k in (7, 11, 13, 17, 19)])
    original = served_document(backend.url)
    journal = root / "state" / "restore-journal-http.json"
    first = tuner(root, "run", str(exp))
    try:
        # a trial's document is served (a variant's rrf_k differs from the one found)
        wait_until(lambda: not first.alive() or (journal.exists() and served_document(backend.url) != original),
                   "a trial's document is served")
        assert first.alive(), f"the run ended before a trial's document was served:\n{first.wait().output}"
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill_quietly()
    left = (served_document(backend.url) != original, journal.exists())
    resumed = tuner(root, "run", str(exp)).wait(DEADLINE_S * 2)
    after = {t.number: t.state.name for t in trials(root, "killed")}
    record = fault_log.add(judge("sigkill-runner-http", damage(root, "killed", backend, original), {
        "the kill left a trial's document served and the journal on disk": left == (True, True),
        "the next start put the original back before any trial, read back": all(
            s in resumed.output for s in ("replayed the restore journal", "wrote the original back (confirmed by "
                                          "read-back)")),
        "the next start exits 0": resumed.returncode == 0,
        "the study completed its trials": list(after.values()).count("COMPLETE") >= 9,
        "the journal is gone": not journal.exists(),
        "the served document is byte-identical": served_document(backend.url) == original,
    }))
    assert_survived(record)


def test_a_refused_put_fails_the_trial_quoting_the_server(tmp_path: Path, demo_data: Path, backend: RunningBackend,
                                                        fault_log: FaultLog) -> None:
    root = tmp_path / "proj"
    exp = project(root, demo_data, backend, study="refused", n_trials=3,
                  variants=[{"name": "negative-k", "fusion.rrf_k": -1}])
    original = served_document(backend.url)
    done = tuner(root, "run", str(exp), "--no-cache").wait()
    found = by_variant(root, "refused")
    refused = found.get("negative-k")
    reason = str(refused.user_attrs.get(ATTR_FAIL_REASON, "")) if refused is not None else ""
    record = fault_log.add(judge("http-put-refused", damage(root, "refused", backend, original), {
        "the run exits 0 (one failed trial is within the budget)": done.returncode == 0,
        "the trial FAILed": refused is not None and refused.state.name == "FAIL" and refused.value is None,
        "its reason is one line quoting the server's 422": "\n" not in reason and all(
            s in reason for s in ("PUT", "refused", "HTTP 422", "fusion.rrf_k", "the served config is unchanged")),
        "the baseline was measured": found.get("baseline") is not None and found["baseline"].state.name == "COMPLETE",
    }))
    assert_survived(record)


def test_a_read_back_that_differs_fails_the_trial_and_records_no_score(tmp_path: Path, demo_data: Path,
                                                                        fault_log: FaultLog) -> None:
    for altering in engine(tmp_path, demo_data, env={KEEP_ON_PUT: "fusion.rrf_k"}):
        root = tmp_path / "proj"
        exp = project(root, demo_data, altering, study="altered", n_trials=2,
                      variants=[{"name": "k20", "fusion.rrf_k": 20}])
        original = served_document(altering.url)
        done = tuner(root, "run", str(exp), "--no-cache").wait()
        found = by_variant(root, "altered")
        altered = found.get("k20")
        reason = str(altered.user_attrs.get(ATTR_FAIL_REASON, "")) if altered is not None else ""
        record = fault_log.add(judge("http-readback-differs", damage(root, "altered", altering, original), {
            "the run exits 0": done.returncode == 0,
            "the altered trial FAILed with no score": altered is not None and altered.state.name == "FAIL"
            and altered.value is None,
            "its reason names the difference": "read-back" in reason and re.search(
                r"fusion\.rrf_k: sent 20(\.0)?, served 60(\.0)?\)", reason) is not None,
            "the baseline (nothing altered) was measured": found.get("baseline") is not None
            and found["baseline"].state.name == "COMPLETE",
        }))
        assert_survived(record)


def test_a_second_run_on_the_same_url_is_refused_and_sigterm_restores(tmp_path: Path, demo_data: Path,
                                                                       backend: RunningBackend,
                                                                       fault_log: FaultLog) -> None:
    root = tmp_path / "proj"
    exp = project(root, demo_data, backend, study="first", n_trials=60)
    other = project(root, demo_data, backend, study="second", n_trials=2, state_dir="state-second")
    original = served_document(backend.url)
    journal = root / "state" / "restore-journal-http.json"
    first = tuner(root, "run", str(exp))
    try:
        wait_until(lambda: not first.alive() or journal.exists(), "the first run wrote a trial's document")
        assert first.alive(), f"the first run ended early:\n{first.wait().output}"
        second = tuner(root, "run", str(other)).wait()
        first.send_signal(signal.SIGTERM)
        stopped = first.wait()
    finally:
        first.kill_quietly()
    record = fault_log.add(judge("two-runs-one-url", damage(root, "first", backend, original), {
        "the first run stops cleanly on SIGTERM": stopped.returncode in (0, 130, 143),
        "the journal is gone": not journal.exists(),
        "the served document is byte-identical after SIGTERM": served_document(backend.url) == original,
    }, injections={"same URL, other study": {
        "exit 2": second.returncode == 2,
        "one line naming the holder": second.one_line_error(f"config URL {backend.url}/admin/config is locked",
                                                            f"pid {first.pid}", "tuner run"),
        "its study was never measured": not (root / "state-second" / "restore-journal-http.json").exists(),
    }}))
    assert_survived(record)
