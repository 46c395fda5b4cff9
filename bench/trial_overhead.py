"""Trial overhead benchmark: how much of a trial is the tuner, not the backend.

    .venv/bin/python bench/trial_overhead.py [--trials 10] [--repeats 5] [--keep DIR]

On the demo (generated data, the reference backend as a process, the demo's search
space, OOS constraint, MLflow tracking, Optuna artifacts; the result cache off so
every trial really runs) it measures, in one run:

1. **Tuner overhead**: the share of trial wall time spent outside the backend restart,
   the health wait and the search calls (first request to last answer). Per trial it
   is ``1 - (restart + health + search) / (ask -> tell)``; for the whole run it is
   ``1 - sum(restart + health + search) / loop wall time``, where the loop time also
   holds the gaps between trials and the final flush of the bookkeeping (reports,
   Optuna artifacts, MLflow runs that overlap the next trial's restart). Goal <= 2 %.
2. **Batch throughput**: a trial's batch evaluation (`LiveEvaluator.evaluate` ->
   `run_batch`: mapping, retries armed, scoring, OOS analysis, threshold sweep) against a plain concurrent load
   run (httpx.AsyncClient, the same concurrency, the same request bodies, no parsing)
   on the same backend process, interleaved ``--repeats`` times. Goal >= 90 %.

Prints a per-phase breakdown (medians, share of the trial, backend or tuner), the
medians and ratios, and PASS / MISS per goal with the load average before and after.
The backend and the tuner share the machine's cores, so figures vary with load; the
ratios are measured side by side in the same run. The plain load uses the evaluation
client's shared TLS context, so neither side pays for loading the CA bundle per run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import optuna

REPO = Path(__file__).resolve().parents[1]

from tuner.config.experiment import load_experiment  # noqa: E402
from tuner.evaluation.client import shared_ssl_context  # noqa: E402
from tuner.evaluation.mapping import prepare_request  # noqa: E402
from tuner.ops.demo import generate_data, write_backend_config  # noqa: E402
from tuner.ops.run import run_experiment  # noqa: E402
from tuner.study.live import LiveEvaluator  # noqa: E402
from tuner.study.wiring import load_dataset  # noqa: E402
from tuner.targets.factory import make_target  # noqa: E402
from tuner.targets.health import wait_healthy  # noqa: E402

GOAL_OVERHEAD = 0.02
GOAL_THROUGHPUT = 0.90
CRITICAL = ("restart", "health", "search")


def write_experiment(root: Path, n_trials: int) -> Path:
    """The demo experiment, re-pointed at a scratch project under ``root``."""
    text = (REPO / "experiments" / "demo.yaml").read_text()
    text = (
        text.replace("state_dir: ../.tuner/demo", "state_dir: .tuner\nproject_root: .")
        .replace("../.tuner/demo/data/", "data/")
        .replace("../.tuner/demo/config.yaml", "backend/config.yaml")
        .replace("../search_space/", f"{REPO / 'search_space'}/")
        .replace("shortlist: shortlist_reference.yaml", f"shortlist: {REPO / 'experiments' / 'shortlist_reference.yaml'}")
        .replace("n_trials: 20", f"n_trials: {n_trials}")
    )
    path = root / "experiment.yaml"
    path.write_text(text)
    return path


def set_up(root: Path, n_trials: int) -> Path:
    generate_data(root / "data", python=sys.executable)
    write_backend_config(REPO / "backend" / "config.yaml", root / "backend" / "config.yaml", root / "data" / "corpus.jsonl")
    return write_experiment(root, n_trials)


def overhead(exp_path: Path, n_trials: int) -> dict[str, Any]:
    exp = load_experiment(exp_path)
    summary = run_experiment(exp, n_trials=n_trials, use_cache=False)
    if summary.error:
        raise SystemExit(f"study failed: {summary.error}")
    study = optuna.load_study(study_name=exp.study, storage=exp.storage)
    trials = {t.number: t for t in study.get_trials()}
    per_trial, phases = [], {}
    critical_total = 0.0
    for outcome in summary.result.ran:
        # ask -> tell plus the loop's own ask / tell calls around the trial
        wall = trials[outcome.number].duration.total_seconds()
        critical = sum(outcome.phase_seconds.get(p, 0.0) for p in CRITICAL)
        critical_total += critical
        per_trial.append(1 - critical / wall)
        for name, seconds in [*outcome.phase_seconds.items(), ("trial (ask -> tell)", wall)]:
            phases.setdefault(name, []).append(seconds)
    loop = summary.result.elapsed_s
    phases_total = sum(t.duration.total_seconds() for t in trials.values() if t.number in
                       {o.number for o in summary.result.ran})
    return {
        "between_s": loop - phases_total - summary.result.flush_s,
        "flush_s": summary.result.flush_s,
        "trials": len(summary.result.ran),
        "per_trial_median": statistics.median(per_trial),
        "overall": 1 - critical_total / loop,
        "loop_s": loop,
        "phases": {k: statistics.median(v) for k, v in phases.items()},
    }


async def plain_load(bodies: list[dict[str, Any]], url: str, concurrency: int, timeout: float) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    # the shared TLS context, as the evaluation client uses: a plain client that is
    # set up once per process, not the CA bundle loaded again per run
    async with httpx.AsyncClient(limits=limits, timeout=timeout, verify=shared_ssl_context()) as client:
        async def one(body: dict[str, Any]) -> None:
            async with sem:
                response = await client.post(url, json=body)
                await response.aread()

        await asyncio.gather(*(one(b) for b in bodies))


def throughput(exp_path: Path, repeats: int) -> dict[str, float]:
    exp = load_experiment(exp_path).bind_port()
    queries, qrels, labels_fp, _note = load_dataset(exp)
    spec = exp.evaluation
    evaluator = LiveEvaluator(exp, queries, qrels, labels_fp)  # exactly what a trial runs
    bodies = [prepare_request(spec, q, f"bench-{i}").json for i, q in enumerate(queries)]
    target = make_target(exp.target, exp.state_dir)
    try:
        target.start()
        wait_healthy(exp.target.health.url, deadline_s=60, target=target)
        evaluator.evaluate(order_seed=0, on_result=None)  # warm both paths (connections, caches)
        asyncio.run(plain_load(bodies, spec.request.url, spec.concurrency, spec.timeout_s))
        batch, plain = [], []
        for i in range(repeats):
            started = time.perf_counter()
            evaluator.evaluate(order_seed=i, on_result=None)
            batch.append(time.perf_counter() - started)
            started = time.perf_counter()
            asyncio.run(plain_load(bodies, spec.request.url, spec.concurrency, spec.timeout_s))
            plain.append(time.perf_counter() - started)
    finally:
        target.close()
    n = len(bodies)
    return {"queries": n, "concurrency": spec.concurrency, "batch_s": statistics.median(batch),
            "plain_s": statistics.median(plain), "batch_qps": n / statistics.median(batch),
            "plain_qps": n / statistics.median(plain), "ratio": statistics.median(plain) / statistics.median(batch)}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_overhead(o: dict[str, Any]) -> None:
    trial = o["phases"]["trial (ask -> tell)"]
    phases = dict(o["phases"])
    # what evaluate() does besides the search window: building the requests before
    # the first one, scoring and result building after the last answer
    if "evaluate" in phases and "search" in phases:
        phases["evaluate - search"] = max(phases["evaluate"] - phases["search"], 0.0)
    print(f"\n== tuner overhead over {o['trials']} trials on the demo (cache off), medians per trial")
    print(f"  {'phase':24s} {'median s':>9s} {'of trial':>9s}  kind")
    for name, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
        if name == "trial (ask -> tell)":
            continue
        kind = ("backend (critical)" if name in CRITICAL else
                "holds search" if name == "evaluate" else "tuner")
        print(f"  {name:24s} {seconds:9.3f} {seconds / trial:9.1%}  {kind}")
    print(f"  {'trial (ask -> tell)':24s} {trial:9.3f} {1:9.1%}")
    print(f"  loop time outside trials: {o['between_s']:.2f} s between trials, {o['flush_s']:.2f} s final flush")
    print(f"  overhead share of the whole loop ({o['loop_s']:.1f} s, incl. gaps and final flush): {o['overall']:.2%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials of the overhead study (default 10)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved throughput repeats (default 5)")
    parser.add_argument("--keep", type=Path, help="set up in this folder and keep it (default: a temp folder)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        exp_path = set_up(root, args.trials)
        o = overhead(exp_path, args.trials)
        t = throughput(exp_path, args.repeats)
    load_after = os.getloadavg()

    print_overhead(o)
    print(f"\n== batch evaluation vs plain load: {t['queries']} queries, concurrency {t['concurrency']}, "
          f"medians of {args.repeats} interleaved runs")
    print(f"  run_batch   {t['batch_s']:.3f} s  {t['batch_qps']:7.1f} q/s")
    print(f"  plain httpx {t['plain_s']:.3f} s  {t['plain_qps']:7.1f} q/s")
    ok_overhead = o["per_trial_median"] <= GOAL_OVERHEAD
    ok_throughput = t["ratio"] >= GOAL_THROUGHPUT
    print(f"\n== goals (load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} on "
          f"{os.cpu_count()} cores; the figures vary with load)")
    print(f"  overhead share per trial (median)   {o['per_trial_median']:7.2%}   goal <= {GOAL_OVERHEAD:.0%}   "
          f"{verdict(ok_overhead)}")
    print(f"  throughput run_batch / plain httpx  {t['ratio']:7.1%}   goal >= {GOAL_THROUGHPUT:.0%}  "
          f"{verdict(ok_throughput)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
