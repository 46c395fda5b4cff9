"""Gate solve benchmark: a trial's "solve" phase (solve_batch + regate) on the demo batch.

    .venv/bin/python bench/solve_bench.py [--batch FILE] [--repeats 20] [--profile]

Sets up the demo like bench/trial_overhead.py (generated data, the reference backend
as a process, the demo's search space and OOS constraint), writes the backend config
with every post-retrieval gate at the low end of its range (what a trial retrieves
with), evaluates one batch of the tune queries and keeps it. ``--batch FILE`` pickles
that BatchResult there, or loads it when the file exists (no backend needed then).

Then it times, interleaved, the two calls a trial makes in ``TrialRunner._solve``
(tuner.study.trial.runner): ``solve_batch`` with the experiment's objective and constraints,
then ``regate`` at the solved values with the confidence gate's declared range, with
today's code (tuner.study.gates.threshold, tuner.evaluation.regate) and with the slow
reference it replaced (tests/threshold/reference_solve.py), and checks that both give
exactly the same values: chosen gates, every column of the sweep table, every metric
and per-query row of the re-gated batch. Prints the medians, the ratio and PASS / MISS
against the goal (<= 15 ms for both calls).

The batch's own scoring (``evaluate_responses``, what ``ResultBuilder.finish`` runs after
a trial's last answer) now also builds the batch's hit table that the solve and regate
reuse; it is timed and checked against its reference (tests/threshold/reference_result.py)
too, so the time is not just moved there. The machine is shared: medians vary with
load, the ratio less (both sides run interleaved in one process).
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the reference copy and the equality checks

from threshold import reference_result  # noqa: E402
from threshold import reference_solve as reference  # noqa: E402
from threshold.equality import assert_same_batch, assert_same_solution, reference_picks_by_todays_rule  # noqa: E402
from trial_overhead import set_up  # noqa: E402

from tuner.config.experiment import load_experiment  # noqa: E402
from tuner.evaluation.regate import regate  # noqa: E402
from tuner.evaluation.result import evaluate_responses  # noqa: E402
from tuner.study.gates.gate_arrays import HitArrays  # noqa: E402
from tuner.study.gates.threshold import CONFIDENCE, MIN_SCORE, retrieval_values, solve_batch  # noqa: E402

GOAL_S = 0.015


def demo_batch(root: Path) -> dict[str, Any]:
    """One batch of the demo's tune queries, retrieved with the gates at their low end,
    plus what a trial solves it with (gates, objective, constraints)."""
    from tuner.config.configpatch import patch_text
    from tuner.study.trial.live import LiveEvaluator
    from tuner.study.wiring import prepare
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_healthy

    paths = set_up(root, 1)  # one experiment file, or one per apply mode (any will do: one batch is run)
    exp_path = next(iter(paths.values())) if isinstance(paths, dict) else paths
    exp = load_experiment(exp_path).bind_port()
    prepared = prepare(exp)
    gates = list(prepared.gates.values())
    for path in exp.target.config_files:  # what a trial writes: every gate at its low end
        path.write_text(patch_text(path.read_text(), retrieval_values(gates), str(path)))
    evaluator = LiveEvaluator(exp, prepared.queries, prepared.qrels, prepared.labels_fingerprint)
    target = make_target(exp.target, exp.state_dir)
    try:
        target.start()
        wait_healthy(exp.target.health.url, deadline_s=60, target=target)
        batch = evaluator.evaluate(order_seed=0, on_result=None)
    finally:
        target.close()
    return {"batch": batch, "gates": gates, "objective": exp.objective.metric,
            "constraints": [(c.name, c.metric, c) for c in exp.constraints]}


def solve_phase(solve_fn: Any, regate_fn: Any, case: dict[str, Any]) -> tuple[Any, Any]:
    """What TrialRunner._solve calls, with ``solve_fn`` / ``regate_fn``."""
    gates = case["gates"]
    constraints = [c for _, _, c in case["constraints"]]
    sol = solve_fn(case["batch"], gates, objective=case["objective"], constraints=constraints)
    conf = next((g for g in gates if g.role == CONFIDENCE), None)
    gated = regate_fn(case["batch"], confidence_threshold=sol.by_role.get(CONFIDENCE),
                      min_score=sol.by_role.get(MIN_SCORE),
                      sweep_range=None if conf is None else (conf.low, conf.high, conf.step or 0.01))
    return sol, gated


def responses_of(batch: Any) -> tuple[Any, ...]:
    """The outcomes the batch was scored from (rebuilt from its rows), for evaluate_responses."""
    from tuner.evaluation.mapping import ParsedResponse
    from tuner.evaluation.outcomes import QueryResponse

    def value(v: Any) -> Any:
        return None if v is None or v != v else v

    failed = {f.query_id for f in batch.failed}
    rows = batch.per_query.to_dict("index")
    responses = [
        QueryResponse(qid, str(r["request_id"]), ParsedResponse(
            batch.hits[qid], value(r["confidence"]), value(r["handoff"]), value(r["fallback_level"]),
            handoff_reason=value(r["handoff_reason"]), truncated=int(r["n_truncated"]),
            repeats=int(r["n_repeats"]),
        ), latency_ms=float(r["latency_ms"]), attempts=int(r["attempts"]))
        for qid, r in rows.items() if qid not in failed
    ]
    return batch.queries, batch.qrels, responses, batch.failed


def medians(sides: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Seconds of each side's call, ``repeats`` times, interleaved."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=Path, help="pickle of the demo batch: loaded when it exists, else written")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side (default 20)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each side")
    args = parser.parse_args()

    if args.batch and args.batch.exists():
        case = pickle.loads(args.batch.read_bytes())
    else:
        with tempfile.TemporaryDirectory(prefix="solve-bench-") as tmp:
            case = demo_batch(Path(tmp))
        if args.batch:
            args.batch.write_bytes(pickle.dumps(case))
    batch = case["batch"]
    grid = " x ".join(f"{g.param} {len(g.values(0.01))}" for g in case["gates"])
    print(f"== demo batch: {len(batch.per_query)} queries ({int(batch.metrics['N_OOS_Queries'])} OOS, "
          f"{len(batch.failed)} failed), {sum(map(len, batch.hits.values()))} hits; grid {grid}")

    sides = {"reference": (reference.solve_batch, reference.regate), "vectorised": (solve_batch, regate)}
    # warm-up, and the values: the reference taking its row by today's rule (tuner.study.gates.gate_choice),
    # so the two are compared whole; its timed runs below keep the margin rule it was written with
    with reference_picks_by_todays_rule(HitArrays.from_batch(batch), case["gates"]):
        outputs = {"reference": solve_phase(*sides["reference"], case)}
    outputs["vectorised"] = solve_phase(*sides["vectorised"], case)
    times = medians({name: (lambda fns=fns: solve_phase(*fns, case)) for name, fns in sides.items()}, args.repeats)
    # The batch's own scoring (ResultBuilder.finish, after a trial's last answer) now also builds
    # the hit table the solve reuses: it must not have grown slower.
    outcomes = responses_of(batch)
    scorers = {"reference": reference_result.evaluate_responses, "vectorised": evaluate_responses}
    scored = {name: f(*outcomes, gains=batch.gains) for name, f in scorers.items()}
    score_times = medians({name: (lambda f=f: f(*outcomes, gains=batch.gains)) for name, f in scorers.items()},
                          args.repeats)
    if args.profile:
        for name, fns in sides.items():
            print(f"\n== profile: {name}")
            prof = cProfile.Profile()
            prof.runcall(solve_phase, *fns, case)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)

    old, new = outputs["reference"], outputs["vectorised"]
    try:
        assert_same_solution(old[0], new[0])
        assert_same_batch(old[1], new[1])
        assert_same_batch(scored["reference"], scored["vectorised"])
        check = "EQUAL (chosen values, sweep table, metrics, per-query rows, threshold sweep; batch scoring)"
    except AssertionError as exc:
        check = f"DIFFERENT: {exc}"
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"  chosen: {old[0].values} (vectorised: {new[0].values}); objective {new[0].objective:.6f}, "
          f"feasible {new[0].feasible}; sweep table {len(new[0].table)} rows x {len(new[0].table.columns)} columns")
    print(f"\n== solve_batch + regate, medians of {args.repeats} interleaved runs")
    for name, seconds in med.items():
        print(f"  {name:11s} {seconds * 1e3:8.2f} ms   (min {min(times[name]) * 1e3:.2f} ms)")
    print(f"  speed-up    {med['reference'] / med['vectorised']:8.1f} x")
    score_med = {name: statistics.median(t) for name, t in score_times.items()}
    print(f"  (the batch's own scoring, evaluate_responses: reference {score_med['reference'] * 1e3:.2f} ms, "
          f"vectorised {score_med['vectorised'] * 1e3:.2f} ms, hit table included)")
    print(f"  value check {check}")
    ok = med["vectorised"] <= GOAL_S
    print(f"  goal <= {GOAL_S * 1e3:.0f} ms: {'PASS' if ok else 'MISS'}")
    return 0 if check.startswith("EQUAL") else 1


if __name__ == "__main__":
    sys.exit(main())
