"""Reference backend benchmark: start-up to healthy, search latency and throughput.

    .venv/bin/python bench/backend_bench.py [--repeats 3] [--requests 300] [--skip-cranfield]

For the demo catalog (generated with fusion_backend.datagen) and Cranfield (imported
from ../shared/datasets with fusion_backend.importers; skipped with a message when
absent) it measures, as medians over ``--repeats`` runs:

* cold start: process start -> /health 200 with an empty index cache (full build);
* warm start: the same with the cache filled (what a tuner restart costs);
* search latency p50 / p95 and throughput (QPS) at concurrency 1, 4 and 8, with the
  data set's own queries and request extras, over keep-alive connections.

Goals: warm start <= 3 s on the demo corpus (every trial restarts the service, so a
study pays it once per trial), p95 <= 50 ms at concurrency 4 (the batch evaluation's
default concurrency: a trial's query set is sent that way). The load generator shares the machine's cores with the service, so the
figures are pessimistic for a service with cores of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.backend import launch_backend, start_backend, write_backend_config  # noqa: E402

SHARED = Path(os.environ.get("TUNER_SHARED_DIR", REPO.parent / "shared")) / "datasets"
GOAL_WARM_S = 3.0
GOAL_P95_MS = 50.0
CONCURRENCY = (1, 4, 8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="requests per concurrency level and repeat")
    parser.add_argument("--skip-cranfield", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="backend-bench-") as tmp:
        root = Path(tmp)
        datasets = {"demo": make_demo(root / "demo")}
        cran = None if args.skip_cranfield else make_cranfield(root / "cranfield")
        if cran is not None:
            datasets["cranfield"] = cran
        for name, directory in datasets.items():
            bench_dataset(name, directory, root / f"{name}-run", args.repeats, args.requests)
    return 0


def make_demo(out: Path) -> Path:
    from fusion_backend.datagen import write_demo

    write_demo(out)
    return out


def make_cranfield(out: Path) -> Path | None:
    src = SHARED / "cranfield"
    if not src.is_dir():
        print(f"cranfield: skipped ({src} not found; set TUNER_SHARED_DIR)")
        return None
    cmd = [sys.executable, "-m", "fusion_backend.importers", "cranfield", "--src", str(src), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"cranfield: skipped (importer failed: {done.stderr.strip()[-300:]})")
        return None
    return out


def bench_dataset(name: str, data: Path, work: Path, repeats: int, n_requests: int) -> None:
    corpus = data / "corpus.jsonl"
    n_docs = sum(1 for line in corpus.open() if line.strip())
    # importers name the query set after the dataset (NAME.queries.jsonl); the demo keeps queries.jsonl
    bodies = query_bodies(next(data.glob("*queries.jsonl")))
    cache = work / "cache"
    config = write_backend_config(work / "config.yaml", corpus=corpus, index_cache=cache)
    print(f"\n== {name}: {n_docs} documents, {len(bodies)} queries ==")

    cold = []
    for i in range(repeats):
        cold.append(time_to_healthy(write_backend_config(work / f"cold{i}.yaml", corpus=corpus,
                                                         index_cache=work / f"cold-cache-{i}")))
    time_to_healthy(config)  # fill the shared cache
    warm = [time_to_healthy(config) for _ in range(repeats)]
    med_cold, med_warm = statistics.median(cold), statistics.median(warm)
    print(f"start-up to healthy: cold {med_cold:.2f} s, warm {med_warm:.2f} s "
          f"(cold/warm {med_cold / med_warm:.1f}x; warm goal {GOAL_WARM_S:.0f} s: "
          f"{'met' if med_warm <= GOAL_WARM_S else 'MISSED'}, {med_warm / GOAL_WARM_S:.2f} of it)")

    with start_backend(config) as backend:
        warmup(backend.url, bodies)
        print(f"{'concurrency':>11} {'p50 ms':>8} {'p95 ms':>8} {'QPS':>8}")
        best_qps = 0.0
        for level in CONCURRENCY:
            runs = [load(backend.url, bodies, level, n_requests) for _ in range(repeats)]
            p50 = statistics.median(r[0] for r in runs)
            p95 = statistics.median(r[1] for r in runs)
            qps = statistics.median(r[2] for r in runs)
            best_qps = max(best_qps, qps)
            note = ""
            if level == 4:
                note = f"  (p95 goal {GOAL_P95_MS:.0f} ms: {'met' if p95 <= GOAL_P95_MS else 'MISSED'}, " \
                       f"{p95 / GOAL_P95_MS:.2f} of it)"
            print(f"{level:>11} {p50:>8.2f} {p95:>8.2f} {qps:>8.0f}{note}")
        print(f"max QPS: {best_qps:.0f}")


def query_bodies(path: Path) -> list[dict[str, Any]]:
    bodies = []
    for line in path.open():
        if not line.strip():
            continue
        q = json.loads(line)
        extras = {k: v for k, v in q.items() if k not in ("query", "query_type", "source", "scope", "split")}
        bodies.append({**extras, "query": q["query"], "top_k": 50})
    return bodies


def time_to_healthy(config: Path) -> float:
    started = time.perf_counter()
    backend = launch_backend(config)
    try:
        backend.wait_healthy(timeout=300)
        return time.perf_counter() - started
    finally:
        backend.stop()


def warmup(url: str, bodies: list[dict[str, Any]]) -> None:
    with httpx.Client(base_url=url) as client:
        for body in bodies[:50]:
            client.post("/search", json=body).raise_for_status()


def load(url: str, bodies: list[dict[str, Any]], concurrency: int, n_requests: int) -> tuple[float, float, float]:
    """(p50 ms, p95 ms, requests per second) for ``n_requests`` over ``concurrency`` workers."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(n_requests))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                client.post("/search", json=bodies[i % len(bodies)]).raise_for_status()
                elapsed = time.perf_counter() - t0
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[94] * 1000, len(latencies) / wall


if __name__ == "__main__":
    raise SystemExit(main())
