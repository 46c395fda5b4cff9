"""Helpers of the browser tests: a small real study made with `tuner run`, `tuner
dashboard` as a subprocess, and headless Debian Chromium driven by selenium.

    project = make_study_project(root)          # data, backend config, space, experiment
    run_study(project)                          # `tuner run` (real backend process)
    with DashboardProcess(project.experiment) as dash: dash.urls["mlflow"] ...
    with chromium() as driver: driver.get(url)

`tuner optuna-dashboard` alone: support.optuna_dashboard (no selenium there).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The same tiny aeronautics catalog the Docker tests use.
sys.path.insert(0, str(REPO / "tests" / "docker"))
from docker_stack import free_port, write_config, write_corpus, write_queries  # noqa: E402
from support.reference_experiment import deep_merge, write_reference_experiment  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("TUNER_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"

STUDY = "browser-study"

# The OOS constraint with the catalog's two OOS queries: answering every query (the
# answer-all variant, threshold fixed at 0) answers both, so the OOS early stop ends it
# COMPLETE and infeasible; the other trials solve the threshold per retrieval (a gate),
# feasible. The best trial's params then hold a solved gate and the simplex weights.
EXPERIMENT: dict[str, Any] = {
    "project_root": ".",
    "state_dir": ".tuner",
    "sampler": {"type": "tpe", "seed": 5},
    "timeout_s": 300,
    "constraints": ["OOS_FP_Rate <= 0.5"],
    "failure_budget": {"max_consecutive": 3, "max_total": 3},
    "dataset": {"dataset_id": "browser-test"},
    "target": {"health": {"deadline_s": 60}},
    "evaluation": {"response": {"results_path": "results", "doc_id": "doc_id", "score": "score"},
                   "concurrency": 2},
    "search_space": "space.yaml",
    "shortlist": [{"name": "answer-all", "confidence.threshold": 0.0},
                  {"name": "hand-off-all", "confidence.threshold": 0.99}],
    "tracking": {"enabled": True},
}

# out of scope, but each shares a word with the catalog (so a backend that answers everything answers them)
EXTRA_OOS = ("heat of a chili pepper", "wing chicken recipe", "shock absorber for a bicycle",
             "layer cake with boundary frosting")

SPACE = """\
params:
  confidence.threshold: {type: float, low: 0.0, high: 0.99, step: 0.01, gate: confidence}
  fusion.rrf_k: {type: int, low: 1, high: 200}
  fusion.weights: {type: simplex, components: [bm25, dense]}
"""


@dataclass(frozen=True)
class StudyProject:
    root: Path

    @property
    def experiment(self) -> Path:
        return self.root / "experiment.yaml"


def make_study_project(root: Path, **overrides: Any) -> StudyProject:
    """``overrides`` are deep-merged into EXPERIMENT (see support.reference_experiment);
    ``tracking.optuna_dashboard_url`` / ``mlflow_ui_url`` set where the links point."""
    root.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(root / "data" / "corpus.jsonl")
    queries, _ = write_queries(root / "data")
    # Six OOS queries in all, so the OOS constraint rests on enough of them (the preflight
    # refuses a constraint that one query decides).
    import json

    with queries.open("a") as q:
        for k, text in enumerate(EXTRA_OOS, start=2):
            q.write(json.dumps({"query_id": f"oos{k}", "query": text, "query_type": "short", "source": "test",
                                "scope": "oos"}) + "\n")
    write_config(root / "backend" / "config.yaml", corpus)
    (root / "space.yaml").write_text(SPACE)
    write_reference_experiment(root, study=STUDY, n_trials=5, **deep_merge(EXPERIMENT, overrides))
    return StudyProject(root)


def tuner_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner", *args]


def run_study(project: StudyProject) -> None:
    proc = subprocess.run(tuner_cmd("run", str(project.experiment)), cwd=project.root, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"tuner run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


_URL_LINE = re.compile(r"^(optuna-dashboard|mlflow): (http://\S+)$")


@dataclass
class DashboardProcess:
    """`tuner dashboard EXPERIMENT` on free ports, in its own process group."""

    experiment: Path
    optuna_port: int = field(default_factory=free_port)
    mlflow_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    urls: dict[str, str] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)

    def start(self, deadline_s: float = 120) -> "DashboardProcess":
        self.proc = subprocess.Popen(
            tuner_cmd("dashboard", str(self.experiment), "--optuna-port", str(self.optuna_port),
                      "--mlflow-port", str(self.mlflow_port)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        assert self.proc.stdout is not None
        end = time.monotonic() + deadline_s
        while len(self.urls) < 2:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"tuner dashboard ended before printing its URLs:\n{''.join(self.output)}")
            self.output.append(line)
            m = _URL_LINE.match(line.strip())
            if m:
                self.urls[m.group(1)] = m.group(2)
            if time.monotonic() > end:
                raise AssertionError(f"no URLs within {deadline_s} s:\n{''.join(self.output)}")
        return self

    def descendants(self) -> set[int]:
        assert self.proc is not None
        return descendants(self.proc.pid)

    def signal_and_wait(self, sig: signal.Signals, timeout: float = 120) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.output.extend(self.proc.stdout.readlines())
        return code

    def __enter__(self) -> "DashboardProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    tree = _proc_children()
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def all_gone(pids: set[int], timeout: float = 120.0) -> list[int]:
    """The pids still alive after ``timeout`` (SIGKILL is delivered asynchronously)."""
    end = time.monotonic() + timeout
    while (left := sorted(p for p in pids if alive(p))) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def chromium_available() -> str | None:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        return "Debian's chromium and chromium-driver are not installed (bash .ci/provision-20-chromium.sh)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (a test extra: pip install -e '.[test]')"
    return None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """Headless Debian Chromium with a fresh profile and no background networking."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tuner-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-quic", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.25, what: str = "") -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path

