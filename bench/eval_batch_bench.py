"""Batch evaluation benchmark: what the tuner adds on top of the HTTP calls.

    .venv/bin/python bench/eval_batch_bench.py [--queries 225] [--results 50] [--repeats 3]

A deterministic search service (tests/support/fake_search.py) runs in its own process
on loopback. For concurrency 1, 4 and 8 it measures, as medians over ``--repeats``:

* raw: a bare httpx.AsyncClient sending the same requests (same concurrency, no
  mapping, no retries, no scoring): the floor set by HTTP and the service;
* run_batch: the whole batch evaluation (requests, retries armed, response mapping,
  scoring, OOS analysis, threshold sweep);
* ratio run_batch / raw (1.0 = no overhead).

It also times the pure parts alone: evaluate_responses for the batch and for 10,000
queries, and query_record (the per-query callback row used for pruning).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.fake_search import synthetic_responses  # noqa: E402

from tuner.data.dataset import Query, QuerySet  # noqa: E402
from tuner.evaluation import (  # noqa: E402
    EvalSpec,
    QueryResponse,
    RequestMapping,
    ResponseMapping,
    evaluate_responses,
    query_record,
    run_batch,
)
from tuner.evaluation.client import shared_ssl_context  # noqa: E402
from tuner.evaluation.mapping import Hit, ParsedResponse  # noqa: E402


def _queries(n: int) -> QuerySet:
    return QuerySet("bench", "h", tuple(
        Query(f"q{i}", f"query {i}", "short", "bench", "oos" if i % 10 == 0 else "in") for i in range(n)
    ))


def _qrels(n: int, k: int) -> dict[str, dict[str, int]]:
    return {f"q{i}": {f"d{i}-{j}": (i + j) % 4 for j in range(0, 2 * k, 3)} for i in range(n)}


async def _raw(url: str, queries: QuerySet, concurrency: int, top_k: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, verify=shared_ssl_context()) as client:  # as run_batch
        async def one(q: Query) -> None:
            async with sem:
                r = await client.post(url, json={"query": q.query, "top_k": top_k})
                r.json()

        await asyncio.gather(*(one(q) for q in queries))


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=225)
    ap.add_argument("--results", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n, k = args.queries, args.results
    queries, qrels = _queries(n), _qrels(n, k)

    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests/support/fake_search.py"), "--queries", str(n), "--results", str(k)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = server.stdout.readline().strip()
        print(f"{n} queries x {k} results against {url} (service in its own process), medians of {args.repeats}")
        print(f"{'concurrency':>11} {'raw s':>8} {'raw q/s':>8} {'batch s':>8} {'batch q/s':>9} {'ratio':>6}")
        for conc in (1, 4, 8):
            spec = EvalSpec(request=RequestMapping(url=url), top_k=k, concurrency=conc,
                            response=ResponseMapping(confidence="confidence", handoff="handoff",
                                                     fallback_level="fallback_level"))
            asyncio.run(_raw(url, queries, conc, k))  # warm-up
            raw = _median_time(lambda: asyncio.run(_raw(url, queries, conc, k)), args.repeats)
            batch = _median_time(lambda: run_batch(spec, queries, qrels), args.repeats)
            print(f"{conc:>11} {raw:>8.3f} {n / raw:>8.0f} {batch:>8.3f} {n / batch:>9.0f} {batch / raw:>6.2f}")
    finally:
        server.stdin.close()
        server.wait(timeout=10)

    payloads = synthetic_responses(n, k)

    def responses_for(qs: QuerySet) -> list[QueryResponse]:
        out = []
        for q in qs:
            p = payloads[f"query {int(q.query_id[1:]) % n}"]
            hits = tuple(Hit(h["doc_id"], h["score"], h["title"]) for h in p["results"])
            out.append(QueryResponse(q.query_id, "r", ParsedResponse(hits, p["confidence"], p["handoff"], "0"), 5.0))
        return out

    resp = responses_for(queries)
    t_eval = _median_time(lambda: evaluate_responses(queries, qrels, resp), args.repeats)
    big = _queries(10_000)
    big_qrels = _qrels(10_000, k)
    big_resp = responses_for(big)
    t_big = _median_time(lambda: evaluate_responses(big, big_qrels, big_resp), args.repeats)
    q0 = queries.queries[1]
    t_rec = _median_time(lambda: [query_record(q0, resp[1], qrels) for _ in range(100)], args.repeats) / 100
    print(f"evaluate_responses: {n} queries {t_eval * 1000:.1f} ms; 10,000 queries {t_big:.2f} s")
    print(f"query_record (per-query callback row): {t_rec * 1000:.2f} ms")


if __name__ == "__main__":
    main()
