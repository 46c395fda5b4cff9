"""The fault suite's harness: a small project around the fault backend, the tuner run
as a user runs it (a subprocess), and the damage a fault left, measured the same way
for every fault class.

    project = Project.create(root, study="storm", n_trials=4, plan={"3": {"status": 503}})
    done = project.tuner("run", "--no-cache")      # Done(returncode, stdout, stderr)
    damage = assess(project, calibration)          # after the processes ended
    record = judge("http-5xx-storm", damage, {"exit 0": done.returncode == 0, ...})

What counts (the definitions the suite reports on):

- a trial is LOST when it was started and has no record (a gap in the study's trial
  numbers), stays RUNNING after every process on the study ended, or is COMPLETE with
  a value that its own config does not give (the fault backend's score is a known
  function of ``fusion.depth``; `Calibration` measures that function once);
- a config is LEFT PATCHED when its bytes differ from the original once the faulted
  process (and, after a SIGKILL, the next start or the worker's reaper) is done; the
  replica copies of `tuner worker` count too;
- a backend SERVED OTHER THAN THE FILE when, after a recovery (the next start after a
  SIGKILL, `tuner apply --recover`), what it serves -- the config fingerprint its
  health answer reports -- is not the sha256 of the config file on disk;
- an ORPHAN is a live process whose command line names the project's directory (the
  tuner, its backends, a worker's reaper): nothing may be left behind;
- a fault is SURVIVED when its checks hold (the tuner ended the way it should: a clean
  one-line error, or a failed trial under the failure budget; the study resumable)
  and it left no lost trial, patched config or orphan.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.reference_experiment import dump_experiment

PYTHON = sys.executable
BACKEND = Path(__file__).with_name("fault_backend.py")
N_QUERIES = 6
DEPTH_AS_FOUND = 4
DEADLINE_S = 180.0  # for waits on a busy machine: an outcome is asserted, never a speed
BODY = {"query": "{query}", "query_id": "{query_id}", "top_k": "{top_k}"}
RELEASE = "{release}"  # in a plan: the project's release file (Project.release), for hold_until

CONFIG_TEXT = f"""\
# The fault backend's config (tests/faults/fault_backend.py); comments and order must survive.
fusion:
  depth: {DEPTH_AS_FOUND}   # rank of each query's relevant document
  label: faults
"""
SPACE_TEXT = "params:\n  fusion.depth: {type: int, low: 1, high: 10}\n"


# ---------------------------------------------------------------- records


@dataclass
class FaultRecord:
    """What one fault class did to the tuner (summed over its injections)."""

    name: str
    injected: int = 0
    survived: int = 0
    trials_lost: int = 0
    configs_left_patched: int = 0
    served_not_the_file: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: FaultRecord) -> None:
        self.injected += other.injected
        self.survived += other.survived
        self.trials_lost += other.trials_lost
        self.configs_left_patched += other.configs_left_patched
        self.served_not_the_file += other.served_not_the_file
        self.problems += other.problems

    def line(self) -> str:
        return (f"fault {self.name}: injected {self.injected}, survived {self.survived}, "
                f"trials lost {self.trials_lost}, configs left patched {self.configs_left_patched}, "
                f"served other than the file {self.served_not_the_file}")

    @property
    def clean(self) -> bool:
        return (self.survived == self.injected and not self.trials_lost and not self.configs_left_patched
                and not self.served_not_the_file)


class FaultLog:
    """The session's records, one summary line per fault class."""

    def __init__(self) -> None:
        self.records: list[FaultRecord] = []

    def add(self, record: FaultRecord) -> FaultRecord:
        self.records.append(record)
        return record

    def by_name(self) -> dict[str, FaultRecord]:
        out: dict[str, FaultRecord] = {}
        for r in self.records:
            out.setdefault(r.name, FaultRecord(r.name)).add(r)
        return out

    def lines(self, classes: Iterable[str]) -> list[str]:
        got = self.by_name()
        names = list(classes) + sorted(set(got) - set(classes))
        return [got[n].line() if n in got else f"fault {n}: not run (skipped or deselected)" for n in names]


def write_summary(terminalreporter: Any, log: FaultLog, classes: Iterable[str]) -> None:
    """The "fault suite" section of the terminal summary: a line per class, then the totals."""
    if not log.records:
        return
    terminalreporter.section("fault suite")
    for line in log.lines(classes):
        terminalreporter.write_line(line)
    lost = sum(r.trials_lost for r in log.records)
    patched = sum(r.configs_left_patched for r in log.records)
    served = sum(r.served_not_the_file for r in log.records)
    terminalreporter.write_line(f"fault suite total: trials lost {lost}, configs left patched {patched}, "
                                f"served other than the file {served}")


def write_worker_records(folder: Path, worker: str, log: FaultLog, classes: Iterable[str]) -> None:
    """An xdist worker's records, for the controller's summary (read_worker_records)."""
    from dataclasses import asdict

    body = {"classes": list(classes), "records": [asdict(r) for r in log.records]}
    tmp = folder / f".{worker}.json.tmp"
    tmp.write_text(json.dumps(body))
    tmp.rename(folder / f"{worker}.json")


def read_worker_records(folder: Path) -> tuple[list[str], FaultLog]:
    """Every worker's records as one log, and the fault classes in the suite's order."""
    classes: list[str] = []
    log = FaultLog()
    for path in sorted(folder.glob("*.json")):
        body = json.loads(path.read_text())
        classes += [c for c in body["classes"] if c not in classes]
        for record in body["records"]:
            log.add(FaultRecord(**record))
    return classes, log


@dataclass
class Damage:
    """What a faulted scenario left behind (see the module docstring)."""

    lost: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    served: list[str] = field(default_factory=list)  # recoveries after which the backend served another config

    def merged(self, other: Damage) -> Damage:
        return Damage(self.lost + other.lost, self.patched + other.patched, self.orphans + other.orphans,
                      self.served + other.served)

    def problems(self) -> list[str]:
        return ([f"lost: {x}" for x in self.lost] + [f"left patched: {x}" for x in self.patched]
                + [f"left running: {x}" for x in self.orphans]
                + [f"served other than the file: {x}" for x in self.served])


def judge(name: str, damage: Damage, checks: Mapping[str, bool],
          injections: Mapping[str, Mapping[str, bool]] | None = None) -> FaultRecord:
    """A record of ``name``: ``checks`` hold for the whole scenario, ``injections``
    (label -> its own checks) for each injected fault; one injection when none given.
    An injection is survived when its checks and the shared ones hold and the scenario
    left no damage."""
    injections = injections or {name: {}}
    shared = [f"check failed: {k}" for k, ok in checks.items() if not ok] + damage.problems()
    record = FaultRecord(name, injected=len(injections), trials_lost=len(damage.lost),
                         configs_left_patched=len(damage.patched), served_not_the_file=len(damage.served),
                         problems=list(shared))
    for label, own in injections.items():
        failed = [f"check failed ({label}): {k}" for k, ok in own.items() if not ok]
        record.problems += failed
        record.survived += int(not shared and not failed)
    return record


def assert_survived(record: FaultRecord) -> None:
    assert record.clean, f"{record.line()}\n  " + "\n  ".join(record.problems)


# ---------------------------------------------------------------- processes


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def one_line_error(self, *needles: str) -> bool:
        """stderr is exactly one ``error: ...`` line holding every needle."""
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        return len(lines) == 1 and lines[0].startswith("error: ") and all(n in lines[0] for n in needles)


class Running:
    """A `tuner` subprocess whose output goes to files (no pipe to fill up)."""

    def __init__(self, argv: list[str], cwd: Path, log_stem: Path, env: Mapping[str, str] | None = None) -> None:
        self.out_path, self.err_path = log_stem.with_suffix(".out"), log_stem.with_suffix(".err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})})

    def stdout_so_far(self) -> str:
        return self._text(self.out_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = DEADLINE_S) -> Done:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.proc.args} did not end within {timeout:g} s:\n{self._text(self.err_path)}")
        return Done(self.proc.returncode, self._text(self.out_path), self._text(self.err_path))

    def kill_quietly(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    @staticmethod
    def _text(path: Path) -> str:
        return path.read_text(errors="replace")


def processes_naming(needle: str) -> list[str]:
    """Command lines of live (non-zombie) processes that contain ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and needle.encode() in cmdline:
            found.append(f"pid {entry.name}: " + cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return found


def all_gone(needle: str, within_s: float = 60.0) -> bool:
    """Whether every process naming ``needle`` ends within ``within_s`` (a reaper or a
    stop timeout may still be at work)."""
    deadline = time.monotonic() + within_s
    while processes_naming(needle):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def wait_until(condition: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out ({deadline_s:g} s) waiting until {what}"
        time.sleep(0.05)


def terminate_connections(storage_url: str, application_name: str) -> int:
    """End every PostgreSQL connection of ``application_name`` (what a server restart
    does to its clients); returns how many. Run from a connection of another name."""
    import sqlalchemy as sa

    from tuner.dburl import sqlalchemy_url

    url = sa.engine.make_url(sqlalchemy_url(storage_url)).update_query_dict({"application_name": "fault-injector"})
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :app"
                " AND usename = current_user AND pid <> pg_backend_pid()"), {"app": application_name}).scalar())
    finally:
        engine.dispose()


class PgOutage:
    """A PostgreSQL restart as its clients see it, for one test's connections: a TCP proxy
    in front of the server (``url`` is the storage URL through it). ``down()`` cuts every
    connection through it (and ends them on the server with ``pg_terminate_backend``) and
    from then on closes each new connection at once, as a server that is away does;
    ``up()`` lets them through again. ``refused`` counts connections turned away: a
    test waits for the tuner to have met the outage before it ends it. The shared
    server itself is never restarted (other suites use it)."""

    def __init__(self, storage_url: str, application_name: str) -> None:
        import socket

        import sqlalchemy as sa

        target = sa.engine.make_url(storage_url)
        self._target = (target.host or "127.0.0.1", int(target.port or 5432))
        self._storage_url, self._app = storage_url, application_name
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = target.set(host="127.0.0.1", port=self._listener.getsockname()[1]).render_as_string(
            hide_password=False)
        self._lock = threading.Lock()
        self._pairs: list[tuple[Any, Any]] = []
        self._down = False
        self.refused = 0
        self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> int:
        """Cut every connection and turn new ones away; returns how many were cut."""
        with self._lock:
            self._down = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _close(sock)
        self.cut += len(pairs) + terminate_connections(self._storage_url, self._app)
        return self.cut

    def up(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self.down()
        _close(self._listener)

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
                if down:
                    self.refused += 1
            if down:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._target, timeout=10)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(src: Any, dst: Any) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _close(src)
        _close(dst)


def _close(sock: Any) -> None:
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# ---------------------------------------------------------------- the project


@dataclass
class Project:
    """A project folder: data, the fault backend's config, a search space, an experiment."""

    root: Path
    study: str
    experiment: Path
    config: Path
    original: bytes
    backend_state: Path
    plan_file: Path
    runs: int = 0

    @classmethod
    def create(cls, root: Path, *, study: str, n_trials: int, plan: Mapping[str, Any] | None = None,
               **overrides: Any) -> Project:
        from support.reference_experiment import deep_merge

        root.mkdir(parents=True, exist_ok=True)
        data = root / "data"
        data.mkdir()
        queries = [{"query_id": f"q{i}", "query": f"fault query {i}", "query_type": "short", "source": "faults",
                    "scope": "in"} for i in range(N_QUERIES)]
        (data / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
        (data / "qrels.txt").write_text("".join(f"{qid} 0 {doc} {grade}\n" for qid, docs in qrels().items()
                                                for doc, grade in docs.items()))
        config = root / "backend" / "config.yaml"
        config.parent.mkdir()
        config.write_text(CONFIG_TEXT)
        (root / "space.yaml").write_text(SPACE_TEXT)
        plan_file = root / "plan.json"
        plan_file.write_text(json.dumps(plan or {}).replace(RELEASE, str(root / "release")))
        backend_state = root / "backend-state"
        doc = deep_merge(base_experiment(study, n_trials, backend_state, plan_file), overrides)
        experiment = root / "experiment.yaml"
        experiment.write_text(dump_experiment(_plain(doc)))
        return cls(root, study, experiment, config, config.read_bytes(), backend_state, plan_file)

    # -- the tuner

    def start(self, *args: str, experiment: Path | None = None, env: Mapping[str, str] | None = None) -> Running:
        """``tuner COMMAND EXPERIMENT ARGS``: ``args[0]`` is the command."""
        self.runs += 1
        command, rest = args[0], list(args[1:])
        argv = [PYTHON, "-m", "tuner", command, str(experiment or self.experiment), *rest]
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        return Running(argv, self.root, logs / f"{self.runs:02d}-{command}", env)

    def tuner(self, *args: str, timeout: float = DEADLINE_S, experiment: Path | None = None,
              env: Mapping[str, str] | None = None) -> Done:
        return self.start(*args, experiment=experiment, env=env).wait(timeout)

    def write_experiment(self, name: str, **overrides: Any) -> Path:
        """Another experiment file in the project: this one with ``overrides`` merged in."""
        from ruamel.yaml import YAML
        from support.reference_experiment import deep_merge

        doc = deep_merge(YAML(typ="safe", pure=True).load(self.experiment.read_text()), overrides)
        path = self.root / name
        path.write_text(dump_experiment(_plain(doc)))
        return path

    def release(self) -> None:
        """Let the searches of a ``hold_until: RELEASE`` fault go on."""
        (self.root / "release").write_text("go\n")

    # -- what happened

    def load(self) -> Any:
        from tuner.config.experiment import load_experiment

        return load_experiment(self.experiment)

    def trials(self) -> list[Any]:
        import optuna

        return optuna.load_study(study_name=self.study, storage=self.load().storage).get_trials()

    def events(self) -> list[dict[str, Any]]:
        path = self.backend_state / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def serving(self, life: int) -> bool:
        """Whether backend life ``life`` has received a search request."""
        return any(e["life"] == life and e["event"] == "search" for e in self.events())

    def lives(self) -> int:
        return sum(e["event"] == "start" for e in self.events())

    def configs(self) -> list[Path]:
        """The config and every replica copy a worker made of it."""
        return [self.config, *sorted(self.config.parent.glob(f"{self.config.stem}.replica-*{self.config.suffix}"))]

    def journal_left(self) -> bool:
        return any(p.name == "restore-journal.json" for p in (self.root / "state").rglob("*.json"))

    def locks_free(self) -> bool:
        from tuner.study.storage.file_locks import lock_file_for, read_holder
        from tuner.study.storage.locks import study_holders

        exp = self.load()
        return not study_holders(exp.storage, self.study) and all(
            read_holder(lock_file_for(c.absolute())) is None for c in self.configs())


def base_experiment(study: str, n_trials: int, backend_state: Path, plan_file: Path) -> dict[str, Any]:
    return {
        "study": study,
        "n_trials": n_trials,
        "project_root": ".",
        "state_dir": "state",
        "sampler": {"type": "tpe", "seed": 11, "n_startup_trials": 3},
        "timeout_s": 900,
        "constraints": [],
        "failure_budget": {"max_consecutive": 3, "max_total": 5},
        "dataset": {"queries": "data/queries.jsonl", "dataset_id": "faults",
                    "labels": [{"path": "data/qrels.txt", "format": "qrels"}]},
        "target": {
            "config_files": ["backend/config.yaml"],
            "apply": "process",
            "port": "auto",
            "process": {"command": ["{python}", str(BACKEND), "--config", "{config}", "--port", "{port}",
                                    "--state", str(backend_state), "--plan", str(plan_file)],
                        "stop_timeout_s": 5},
            "health": {"url": "http://127.0.0.1:{port}/health", "deadline_s": 60, "interval_s": 0.1},
        },
        "evaluation": {
            "request": {"url": "http://127.0.0.1:{port}/search", "body": BODY},
            "top_k": 10,
            "concurrency": 2,
            "timeout_s": 10,
            "retries": 3,
            "backoff_s": 0.1,
            "backoff_max_s": 1.0,
        },
        "search_space": "space.yaml",
        "tracking": {"enabled": False},
    }


def qrels() -> dict[str, dict[str, int]]:
    """Every document the backend returns is judged: the relevant one Fully, the rest Irrelevant."""
    return {f"q{i}": {f"q{i}-rel": 3, **{f"q{i}-d{j}": 0 for j in range(10)}} for i in range(N_QUERIES)}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


# ---------------------------------------------------------------- the score of a depth


class Calibration:
    """``expected(depth)``: the objective the fault backend gives on ``fusion.depth``,
    measured once per depth by the tuner's own batch evaluation against an in-process
    fault backend without faults."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._cache: dict[int, float] = {}
        self._lock = threading.Lock()

    def expected(self, depth: int) -> float:
        with self._lock:
            if depth not in self._cache:
                self._cache[depth] = self._measure(depth)
            return self._cache[depth]

    def _measure(self, depth: int) -> float:
        from faults.fault_backend import serve
        from tuner.data.dataset import load_queryset
        from tuner.evaluation import run_batch
        from tuner.evaluation.spec import EvalSpec, RequestMapping

        where = self.workdir / f"depth-{depth}"
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.yaml").write_text(CONFIG_TEXT.replace(f"depth: {DEPTH_AS_FOUND}", f"depth: {depth}"))
        queries = where / "queries.jsonl"
        queries.write_text("".join(json.dumps({"query_id": f"q{i}", "query": f"fault query {i}", "query_type": "short",
                                               "source": "faults", "scope": "in"}) + "\n" for i in range(N_QUERIES)))
        server = serve(where / "config.yaml", 0, where / "state", {})
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            spec = EvalSpec(request=RequestMapping(url=f"http://127.0.0.1:{server.server_address[1]}/search", body=BODY),
                            top_k=10)
            result = run_batch(spec, load_queryset(queries, "faults"), qrels())
        finally:
            server.shutdown()
            server.server_close()
        return float(result.metrics["Primary_Metric_Score"])


# ---------------------------------------------------------------- damage


def assess(project: Project, calibration: Calibration, *, settle_s: float = 30.0) -> Damage:
    """The damage left once every process of the scenario has ended (orphans get
    ``settle_s`` to go: a reaper or a stop timeout may still be at work)."""
    damage = Damage()
    all_gone(str(project.root), settle_s)
    damage.orphans = processes_naming(str(project.root))
    damage.patched = [str(c) for c in project.configs() if c.read_bytes() != project.original]
    damage.lost = lost_trials(project.trials(), calibration)
    return damage


def unrecorded_or_running(trials: list[Any]) -> list[str]:
    """Trials lost whatever the backend: gaps in the study's trial numbers (Optuna
    numbers trials as they are created) and trials still RUNNING."""
    from optuna.trial import TrialState

    numbers = sorted(t.number for t in trials)
    missing = sorted(set(range(numbers[-1] + 1)) - set(numbers)) if numbers else []
    return ([f"trial #{n}: started but not in the study" for n in missing]
            + [f"trial #{t.number}: still RUNNING after every process ended" for t in trials
               if t.state == TrialState.RUNNING])


def lost_trials(trials: list[Any], calibration: Calibration) -> list[str]:
    from optuna.trial import TrialState

    lost = unrecorded_or_running(trials)
    for t in trials:
        if t.state == TrialState.COMPLETE:
            from tuner.study.trial.attrs import assignment_of

            depth = int(assignment_of(t)["fusion.depth"])
            want = calibration.expected(depth)
            if t.value is None or abs(t.value - want) > 1e-9:
                lost.append(f"trial #{t.number}: COMPLETE with {t.value}, but its depth {depth} scores {want}")
    return lost


def fail_reasons(trials: list[Any]) -> dict[int, str]:
    from optuna.trial import TrialState

    return {t.number: str(t.user_attrs.get("fail_reason", "")) for t in trials
            if t.state == TrialState.FAIL and ran(t)}


def ran(trial: Any) -> bool:
    """False for a trial the pipelined loop began ahead and a stop kept from being measured
    (told FAIL as interrupted, its params queued again: tuner.study.pipeline)."""
    return "begun ahead" not in str(trial.user_attrs.get("fail_reason", ""))


def states(trials: list[Any]) -> list[str]:
    """The states of the trials that ran, by number (not those queued, nor those begun
    ahead and told FAIL unmeasured)."""
    return [t.state.name for t in sorted(trials, key=lambda t: t.number) if ran(t) and t.state.name != "WAITING"]
