"""Restart-to-healthy time of the reference backend as a compose container and as a
local process, and what the tuner adds on top of the bare restart.

For each target, REPEATS restarts of each kind, interleaved (bare, tuner, bare, ...):

- bare: the restart primitive alone and a tight 10 ms poll of GET /health (docker:
  the engine's restart call; process: SIGTERM, wait, start the same command);
- tuner: what a trial does (`Target.restart()` then `tuner.targets.health.wait_healthy` with
  the experiment defaults), for docker with and without waiting for the container's
  own healthcheck (compose.yaml checks every second).

Prints medians, the tuner's added time (tuner - bare) and the ratio.

    python bench/restart_bench.py [--repeats 5] [--docs 2000]

Needs a Docker engine, docker-compose and the local base image (bash
.ci/provision-10-docker.sh); the process rows run without Docker (--no-docker).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "docker"))
from docker_stack import ComposeStack, build_images, docker_unavailable, free_port, write_config, write_corpus  # noqa: E402

from tuner.config.target import DockerConfig, ProcessConfig  # noqa: E402
from tuner.targets.docker import DockerTarget  # noqa: E402
from tuner.targets.health import wait_healthy  # noqa: E402
from tuner.targets.process import ProcessTarget  # noqa: E402

POLL_S = 0.01
HEALTH_INTERVAL_S = 0.2  # experiments/*.yaml: target.health.interval_s


def poll_health(url: str, deadline_s: float = 120) -> None:
    """The bare reference: as tight a poll as a person could write."""
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=2) as http:
        while time.monotonic() < end:
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL_S)
    raise SystemExit(f"{url} not healthy within {deadline_s} s")


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(kinds: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Interleaved: each round runs every kind once, so drift hits all kinds alike."""
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for name, fn in kinds.items():
            out[name].append(timed(fn))
    return out


def docker_rows(repeats: int, n_docs: int) -> dict[str, list[float]]:
    import docker

    build_images(["backend"])
    stack = ComposeStack.create(Path(tempfile.mkdtemp(prefix="restart-bench-")), n_docs=n_docs)
    health = f"{stack.backend_url}/health"
    try:
        stack.up("backend")
        poll_health(health)
        client = docker.from_env()
        [container] = client.containers.list(filters={"label": f"com.docker.compose.project={stack.project}"})

        def bare() -> None:
            client.api.restart(container.id, timeout=5)
            poll_health(health)

        def tuner(wait_container_health: bool) -> Callable[[], None]:
            cfg = DockerConfig(service="backend", project=stack.project, stop_timeout_s=5,
                               wait_container_health=wait_container_health)
            target = DockerTarget(cfg, config_files=[stack.config_path])

            def run() -> None:
                target.restart()
                wait_healthy(health, deadline_s=120, target=target, interval_s=HEALTH_INTERVAL_S,
                             max_interval_s=max(HEALTH_INTERVAL_S, 0.5))
            return run

        rows = measure({"docker: bare restart + 10 ms poll": bare,
                        "docker: tuner (container healthcheck + /health)": tuner(True),
                        "docker: tuner (/health only)": tuner(False)}, repeats)
        client.close()
        return rows
    finally:
        stack.down()


def process_rows(repeats: int, n_docs: int) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="restart-bench-proc-"))
    config = write_config(work / "config.yaml", write_corpus(work / "data" / "corpus.jsonl", n_docs))
    port = free_port()
    health = f"http://127.0.0.1:{port}/health"
    argv = [sys.executable, "-m", "fusion_backend", "serve", "--config", str(config), "--port", str(port)]
    log = open(work / "bare.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    poll_health(health)  # builds the index cache once

    def bare() -> None:
        nonlocal proc
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        poll_health(health)

    target = ProcessTarget(ProcessConfig(command=argv), config_files=[config], state_dir=work)

    def tuner() -> None:
        target.restart()
        wait_healthy(health, deadline_s=120, target=target, interval_s=HEALTH_INTERVAL_S,
                     max_interval_s=max(HEALTH_INTERVAL_S, 0.5))

    # The two share the port, so they take turns; each timed restart stops a healthy
    # backend and ends when the new one answers /health.
    rows: dict[str, list[float]] = {"process: bare restart + 10 ms poll": [], "process: tuner (ProcessTarget + /health)": []}
    try:
        for _ in range(repeats):
            rows["process: bare restart + 10 ms poll"].append(timed(bare))
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            target.start()
            poll_health(health)
            rows["process: tuner (ProcessTarget + /health)"].append(timed(tuner))
            target.stop()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            poll_health(health)
    finally:
        target.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        log.close()
    return rows


def report(rows: dict[str, list[float]], bare_key: str) -> None:
    bare = statistics.median(rows[bare_key])
    for name, values in rows.items():
        med = statistics.median(values)
        extra = "" if name == bare_key else f"   added {med - bare:+.2f} s   ratio {med / bare:.2f}x"
        spread = f"[{min(values):.2f} .. {max(values):.2f}]"
        print(f"  {name:<50} median {med:6.2f} s {spread:>16}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--docs", type=int, default=2000, help="corpus size of the generated catalog")
    ap.add_argument("--no-docker", action="store_true")
    args = ap.parse_args()
    print(f"restart-to-healthy, median of {args.repeats} restarts each, {args.docs} documents (index cache warm)")
    if not args.no_docker:
        reason = docker_unavailable()
        if reason:
            print(f"  docker rows skipped: {reason}")
        else:
            report(docker_rows(args.repeats, args.docs), "docker: bare restart + 10 ms poll")
    report(process_rows(args.repeats, args.docs), "process: bare restart + 10 ms poll")


if __name__ == "__main__":
    main()
