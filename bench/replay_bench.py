"""Fusion replay vs sampled fusion: final best and wall time to 99 % of the dense-grid optimum.

    .venv/bin/python bench/replay_bench.py [--datasets demo,cranfield] [--seeds 5] [--trials 40] [--quick]

For each data set (the demo catalog; Cranfield from ../shared/datasets with CACM OOS
queries: the bundles of bench/cached_backend.py, BM25 + dense) and each seed, two real
studies are run with the CLI (``tuner run``, a fresh state folder each, the reference
backend as a process taking each trial's config by ``POST /admin/reload``):

- **sampled** (today): TPE (seeded, multivariate, 6 start-up trials) samples
  fusion.method, fusion.rrf_k, fusion.weights and fusion.normalization; each trial
  serves its setting, runs the query set once and solves the two gates from it;
- **replay** (``replay:`` in the experiment, tuner.config.replay, its defaults): the same
  params are not sampled; each trial runs the query set once *explained*, bounds every
  setting of the default grid (294) from that one retrieval and scores exactly those that
  can be among the best, with the gates solved jointly (one helper process beside the
  tuner's on 2 cores), then serves the best ``verify_top`` (1) and reports the best
  *live* value;
- **replay, exhaustive** (``bound: false, workers: 0``): replay without the bound and the
  helper, every setting scored exactly in the tuner's own process; the same best.

Both arms do the same work per query: the same backend process and data, the same
queries and labels, the same search space (the fusion params plus the two post-retrieval
gates confidence.threshold and citation.min_score, solved per retrieval), the same
constraint ``OOS_FP_Rate <= 0.10`` and objective (Primary_Metric_Score, maximised);
no baseline, shortlist, holdout or tracking, the result cache off (``--no-cache``), pipelined.

The **dense-grid optimum** is one replay trial over a dense grid (RRF k at 40 log-spaced
points, 32 distinct integers, x 51 weight splits + 51 x {minmax, z}: 1734 settings, every
one scored exactly, no bound, the gates solved), its best verified live. The wall time of a study is read from its Optuna storage: a trial's
completion minus the first trial's start (the CLI's start-up and preflight, the same for
both arms, are left out). Per arm it prints medians over seeds of the final best, the
wall time and trials to reach 99 % of the optimum (a seed that never gets there counts
its whole wall time, so the median is a lower bound, shown "≥"), and the wall time per
trial; then sampled / replay time-to-99 %. Value check: in every replay trial each
verified setting's replayed value must equal its live one (mismatches: 0). Also printed:
the phases of each arm's first trial, the load average, and a hash of the tuner's and the
backend's sources at the start and the end (a change during the run is said).

Goal (the issue's acceptance): replay reaches 99 % of the grid optimum in at least 5x
less wall time than sampled fusion, with an equal or better final best.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import CONSTRAINT, quiet, table  # noqa: E402
from cached_backend import REPO, bundle  # noqa: E402

from tuner.config.configpatch import patch_text  # noqa: E402
from tuner.config.experiment import load_experiment  # noqa: E402
from tuner.ops.demo import DEMO_BASELINE  # noqa: E402
from tuner.study.trial.attrs import ATTR_PHASES, ATTR_REPLAY, trial_attr  # noqa: E402

GOAL_SPEEDUP = 5.0
SHARE = 0.99
REPLAY_TRIALS = 3  # a replay of the whole space stops after 1 (tuner run says so): asked for 3, runs 1
REPLAYED = {"fusion.method": "method", "fusion.rrf_k": "rrf_k", "fusion.weights": "weights",
            "fusion.normalization": "normalization"}
#: the reference optimum scores every setting exactly (no bound), so it does not rest on what is measured
DENSE = {"points": 40, "weight_step": 0.02, "max_settings": 10000, "verify_top": 1, "bound": False}
#: the replay arm as it was before the bound and the helper: every setting scored exactly, in the tuner's process
EXHAUSTIVE = {"bound": False, "workers": 0}
TOLERANCE = 1e-9

SPACE_YAML = """\
description: Fusion of the reference backend with its two gates solved per retrieval (bench/replay_bench.py).
params:
  fusion.method: {type: categorical, choices: [rrf, linear]}
  fusion.rrf_k: {type: int, low: 1, high: 200, log: true, when: {fusion.method: rrf}}
  fusion.weights: {type: simplex, components: [bm25, dense]}
  fusion.normalization: {type: categorical, choices: [minmax, z], when: {fusion.method: linear}}
  confidence.threshold: {type: float, low: 0.0, high: 0.9, step: 0.01, gate: confidence}
  citation.min_score: {type: float, low: 0.0, high: 0.5, step: 0.01, gate: min_score}
"""

# experiments/demo.yaml's target and evaluation, the paths filled in per run
TARGET: dict[str, Any] = {
    "apply": "process",
    "port": "auto",
    "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config", "{config}", "--port", "{port}"],
                "stop_timeout_s": 10},
    "reload": {"http": {"url": "http://127.0.0.1:{port}/admin/reload", "method": "POST"},
               "fingerprint": "config_fingerprint",
               "restart_keys": ["data", "server", "sources.*.k1", "sources.*.b", "sources.*.embedder",
                                "sources.*.dims"]},
    "health": {"url": "http://127.0.0.1:{port}/health", "deadline_s": 120, "interval_s": 0.1,
               "fingerprint": "data_fingerprint"},
}
EVALUATION: dict[str, Any] = {
    "request": {"url": "http://127.0.0.1:{port}/search",
                "body": {"query": "{query}", "top_k": "{top_k}", "query_id": "{query_id}"}},
    "response": {"results_path": "results", "doc_id": "doc_id", "score": "score", "title": "title",
                 "confidence": "confidence", "handoff": "handoff", "handoff_reason": "handoff_reason",
                 "fallback_level": "fallback_level"},
    "top_k": 50,
    "concurrency": 4,
}


@dataclass
class Run:
    """One finished study: wall time and best feasible value after each trial."""

    label: str
    elapsed: list[float]  # seconds from the first trial's start to each trial's completion
    best: list[float]  # best feasible value so far (NaN until a feasible trial)
    failed: int
    replay: list[dict[str, Any]] = field(default_factory=list)  # the "replay" attr of each trial
    phases: list[dict[str, float]] = field(default_factory=list)  # each trial's phase seconds, in completion order
    values: list[float] = field(default_factory=list)
    cli_s: float = 0.0

    @property
    def final(self) -> float:
        return self.best[-1] if self.best else math.nan

    @property
    def wall(self) -> float:
        return self.elapsed[-1] if self.elapsed else math.nan

    def reach(self, target: float) -> tuple[int, float] | None:
        """(trials, seconds) at which the best so far first reaches ``target``; None: never."""
        for i, (b, t) in enumerate(zip(self.best, self.elapsed)):
            if not math.isnan(b) and b >= target:
                return i + 1, t
        return None


@dataclass
class Setup:
    name: str
    root: Path
    data: Path
    config_text: str
    space: Path
    queries: int = 0


def set_up(name: str, root: Path) -> Setup:
    """The data bundle, a backend config (the reference one on the bundle, its index cached
    once for every run of the data set) and the search space, all under ``root``."""
    data = bundle(name, root)
    text = (REPO / "backend" / "config.yaml").read_text(encoding="utf-8")
    edits = {"data.corpus": str(data / "corpus.jsonl"), "data.index_cache": str(root / f"{name}-index"),
             **DEMO_BASELINE}
    space = root / "space.yaml"
    space.write_text(SPACE_YAML)
    n = sum(1 for line in (data / "queries.jsonl").read_text().splitlines() if line.strip())
    return Setup(name, root, data, patch_text(text, edits, "backend/config.yaml"), space, n)


def write_experiment(s: Setup, label: str, *, seed: int, n_trials: int, replay: dict[str, Any] | None,
                     apply: str = "reload") -> Path:
    from ruamel.yaml import YAML

    run_dir = s.root / "runs" / label
    run_dir.mkdir(parents=True)
    config = run_dir / "config.yaml"
    config.write_text(s.config_text, encoding="utf-8")
    doc: dict[str, Any] = {
        "study": label,
        "description": f"bench/replay_bench.py: {label}",
        "project_root": str(run_dir),
        "state_dir": str(run_dir / "state"),
        "sampler": {"type": "tpe", "seed": seed, "multivariate": True, "n_startup_trials": 6},
        "pruner": {"type": "none"},
        "n_trials": n_trials,
        "timeout_s": 3600,
        "objective": {"metric": "Primary_Metric_Score", "direction": "maximize"},
        "constraints": [CONSTRAINT],
        "failure_budget": {"max_consecutive": 3, "max_total": 6},
        "dataset": {"queries": str(s.data / "queries.jsonl"), "dataset_id": s.name,
                    "labels": [{"path": str(s.data / "qrels.txt"), "format": "qrels"}]},
        "target": {"config_files": [str(config)], "inputs": [str(s.data / "corpus.jsonl")],
                   **{k: v for k, v in TARGET.items() if apply == "reload" or k != "reload"}},
        "evaluation": EVALUATION,
        "search_space": str(s.space),
        "baseline": False,
        "holdout": {"enabled": False},
        "tracking": {"enabled": False},
        "pipeline": True,
    }
    if replay is not None:
        doc["replay"] = {"params": dict(REPLAYED), **replay}
    path = run_dir / "experiment.yaml"
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    with path.open("w") as fh:
        yaml.dump(doc, fh)
    return path


def tuner_cli() -> list[str]:
    exe = Path(sys.executable).with_name("tuner")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "tuner"]


def run(s: Setup, label: str, *, seed: int, n_trials: int, replay: dict[str, Any] | None,
        apply: str = "reload") -> Run:
    exp_path = write_experiment(s, label, seed=seed, n_trials=n_trials, replay=replay, apply=apply)
    log = exp_path.with_name("tuner.log")
    started = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run([*tuner_cli(), "run", str(exp_path), "--no-cache"], stdout=fh, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=exp_path.parent, check=False)
    cli_s = time.perf_counter() - started
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"`tuner run {exp_path}` exited {proc.returncode}:\n{tail}")
    out = read_study(exp_path, label)
    out.cli_s = cli_s
    return out


def read_study(exp_path: Path, label: str) -> Run:
    exp = load_experiment(exp_path)
    study = optuna.load_study(study_name=exp.study, storage=exp.storage)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    if not trials:
        raise SystemExit(f"{label}: the study has no trial")
    t0 = min(t.datetime_start for t in trials if t.datetime_start is not None)
    done = [t for t in trials if t.datetime_complete is not None]
    done.sort(key=lambda t: t.datetime_complete)
    best, elapsed, bests, values, replays, phases = -math.inf, [], [], [], [], []
    for t in done:
        if t.state == optuna.trial.TrialState.COMPLETE and feasible(t):
            best = max(best, t.value)
        elapsed.append((t.datetime_complete - t0).total_seconds())
        bests.append(best if best > -math.inf else math.nan)
        values.append(t.value if t.value is not None else math.nan)
        phases.append(dict(trial_attr(t, ATTR_PHASES) or {}))
        if (record := trial_attr(t, ATTR_REPLAY)) is not None:  # a system attribute (tuner.replay)
            replays.append(record)
    failed = sum(t.state == optuna.trial.TrialState.FAIL for t in trials)
    return Run(label, elapsed, bests, failed, replays, phases, values)


def feasible(t: optuna.trial.FrozenTrial) -> bool:
    if "feasible" in t.user_attrs:
        return bool(t.user_attrs["feasible"])
    c = t.constraints
    return all(v <= 0 for v in (c.values() if isinstance(c, dict) else c or []))


# ---------------------------------------------------------------- medians


def censored_median(values: list[tuple[float, bool]]) -> tuple[float, bool]:
    """Median of (value, is_lower_bound) pairs; the flag says the median is a lower bound
    (a lower bound sits at or below the median's position in the sorted values)."""
    ordered = sorted(values, key=lambda v: (v[0], v[1]))
    n = len(ordered)
    upto = n // 2 + 1  # the elements up to the median's position(s)
    return statistics.median(v for v, _ in ordered), any(c for _, c in ordered[:upto])


def fmt_bound(value: float, bound: bool, spec: str = ".1f") -> str:
    return ("≥ " if bound else "") + format(value, spec)


def summarise(runs: list[Run], target: float) -> dict[str, Any]:
    times, counts = [], []
    for r in runs:
        got = r.reach(target)
        times.append((got[1], False) if got else (r.wall, True))
        counts.append((float(got[0]), False) if got else (float(len(r.best) + 1), True))
    per_trial = [r.wall / len(r.best) for r in runs]
    return {"final": statistics.median(_finite(r.final) for r in runs),
            "time": censored_median(times), "trials": censored_median(counts),
            "per_trial": statistics.median(per_trial), "wall": statistics.median(r.wall for r in runs),
            "failed": sum(r.failed for r in runs),
            "seeds_reached": sum(not c for _, c in times), "n": len(runs),
            "per_seed": [f"{t:.1f}" + ("+" if c else "") for t, c in times]}


def _finite(v: float) -> float:
    return v if not math.isnan(v) else 0.0


def first_trial_phases(runs: list[Run]) -> str:
    """The main phases of each study's first completed trial, medians over the studies."""
    keys = ("reload", "evaluate", "explain", "replay", "verify")
    firsts = [r.phases[0] for r in runs if r.phases]
    parts = [f"{k} {statistics.median(f.get(k, 0.0) for f in firsts):.2f}" for k in keys
             if any(k in f for f in firsts)]
    return ", ".join(parts) + f" (trial {statistics.median(r.elapsed[0] for r in runs):.2f})"


def code_fingerprint() -> str:
    """A hash of the tuner's and the reference backend's sources: the bench measures the
    working tree, so a change during the run is said (the numbers would mix versions)."""
    h = hashlib.sha256()
    for root in (REPO / "tuner", REPO / "backend" / "fusion_backend"):
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def replay_check(runs: list[Run]) -> tuple[int, int, float]:
    """(verified settings, mismatches, largest |replayed - live|) over every replay trial."""
    n = bad = 0
    worst = 0.0
    for r in runs:
        for rec in r.replay:
            for v in rec.get("verified", []):
                n += 1
                gaps = [_gap(v["replayed"], v["live"]), _gap(v["replayed_violation"], v["live_violation"])]
                worst = max(worst, *gaps)
                bad += any(g > TOLERANCE for g in gaps)
    return n, bad, worst


def scored_median(runs: list[Run]) -> str:
    counts = [rec["scored"] for r in runs for rec in r.replay]
    return f"{statistics.median(counts):g} of {runs[0].replay[0].get('settings', '?')}" if counts else "-"


def _gap(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


# ---------------------------------------------------------------- one data set


def bench_dataset(name: str, work: Path, seeds: int, n_trials: int, modes: list[str]) -> dict[str, dict[str, Any]]:
    """The dense-grid optimum of ``name`` (once), then both arms in each apply mode."""
    s = set_up(name, work / name)
    dense = run(s, f"{name}-dense", seed=0, n_trials=1, replay=dict(DENSE))
    if not dense.replay or math.isnan(dense.final):
        raise SystemExit(f"[{name}] the dense-grid replay trial found no feasible setting: {dense.values}")
    optimum = dense.final
    grid = dense.replay[0]
    print(f"\n== {name}: {s.queries} queries; dense-grid optimum {optimum:.4f} ({grid['chosen_by']}, "
          f"{grid['scored']} settings scored, best verified live: {grid['verified'][0]['assignment']}; "
          f"trial {dense.wall:.1f} s)", flush=True)
    return {mode: bench_mode(s, mode, optimum, dense, seeds, n_trials) for mode in modes}


def bench_mode(s: Setup, mode: str, optimum: float, dense: Run, seeds: int, n_trials: int) -> dict[str, Any]:
    """Both arms over ``seeds`` with the backend taking each config by ``mode`` (reload or restart)."""
    name = s.name
    started, load_start = time.perf_counter(), os.getloadavg()
    target = SHARE * optimum
    print(f"-- {name}, trials {'reload' if mode == 'reload' else 'restart'} the backend", flush=True)
    runs: dict[str, list[Run]] = {"sampled": [], "replay": [], "replay, exhaustive": []}
    for seed in range(seeds):
        runs["sampled"].append(run(s, f"{name}-{mode}-sampled-s{seed}", seed=seed, n_trials=n_trials, replay=None,
                                   apply=mode))
        runs["replay"].append(run(s, f"{name}-{mode}-replay-s{seed}", seed=seed, n_trials=REPLAY_TRIALS, replay={},
                                  apply=mode))
        runs["replay, exhaustive"].append(run(s, f"{name}-{mode}-exhaustive-s{seed}", seed=seed,
                                              n_trials=REPLAY_TRIALS, replay=dict(EXHAUSTIVE), apply=mode))
        print(f"  seed {seed}: " + ", ".join(
            f"{arm} final {rs[-1].final:.4f} in {rs[-1].wall:.1f} s ({len(rs[-1].best)} trials, CLI "
            f"{rs[-1].cli_s:.1f} s)" for arm, rs in runs.items()), flush=True)
    summary = {arm: summarise(rs, target) for arm, rs in runs.items()}
    sm, rp, ex = summary["sampled"], summary["replay"], summary["replay, exhaustive"]
    ratio = sm["time"][0] / rp["time"][0] if rp["time"][0] > 0 else math.inf
    ratio_note = ("≥ " if sm["time"][1] and not rp["time"][1] else
                  "≤ " if rp["time"][1] and not sm["time"][1] else "? " if rp["time"][1] else "")
    rows = []
    for arm, sm_ in summary.items():
        t, tb = sm_["time"]
        reached = fmt_bound(t, tb) if sm_["seeds_reached"] else f"not reached (> {t:.1f} s)"
        rows.append([arm, sm_["final"], sm_["final"] / optimum, reached, fmt_bound(sm_["trials"][0], sm_["trials"][1], ".0f"),
                     f"{sm_['seeds_reached']}/{sm_['n']}", f"{sm_['per_trial']:.2f}", f"{sm_['wall']:.1f}",
                     sm_["failed"], " ".join(sm_["per_seed"])])
    print(f"-- medians over {seeds} seeds; target {SHARE:.0%} of the grid optimum = {target:.4f} "
          f"(sampled: {n_trials} trials, replay: {REPLAY_TRIALS} asked; {CONSTRAINT})")
    print(table(["arm", "final best", "/optimum", "time to 99%, s", "trials to 99%", "seeds reached",
                 "s/trial", "wall, s", "failed", "time to 99% per seed, s (+: not reached, whole wall)"], rows))
    print(f"sampled / replay time to 99%: {ratio_note}{ratio:.1f}x; exhaustive / bounded replay: "
          f"{ex['time'][0] / rp['time'][0]:.2f}x; settings scored exactly per replay trial (median): bounded "
          f"{scored_median(runs['replay'])}, exhaustive {scored_median(runs['replay, exhaustive'])}")
    print("where a trial's time goes (median phase seconds of each study's first trial): "
          + "; ".join(f"{arm} {first_trial_phases(rs)}" for arm, rs in runs.items()))
    checked, bad, worst = replay_check([dense, *runs["replay"], *runs["replay, exhaustive"]])
    same = [a.final == b.final for a, b in zip(runs["replay"], runs["replay, exhaustive"], strict=True)]
    print(f"bounded vs exhaustive replay: the same final best in {sum(same)}/{len(same)} seeds")
    print(f"value check: {checked} verified settings in {1 + 2 * len(runs['replay'])} replay studies (the dense one "
          f"included), replayed vs live "
          f"mismatches: {bad} (largest |difference| {worst:.2g})")
    verdict = goal_verdict(ratio, ratio_note, rp["final"] >= sm["final"] and bad == 0 and all(same))
    print(f"GOAL replay >= {GOAL_SPEEDUP:.0f}x faster to 99% with an equal or better final best: "
          f"{ratio_note}{ratio:.1f}x, final {rp['final']:.4f} vs {sm['final']:.4f} -> {verdict}")
    load_end = os.getloadavg()
    print(f"[{name}, {mode}] {time.perf_counter() - started:.0f} s; load average start / end {load_start[0]:.2f} / "
          f"{load_end[0]:.2f} on {os.cpu_count()} cores", flush=True)
    return {"optimum": optimum, "sampled": sm, "replay": rp, "ratio": f"{ratio_note}{ratio:.1f}x",
            "verdict": verdict, "mismatches": bad}


def goal_verdict(ratio: float, note: str, final_ok: bool) -> str:
    """MET / MISSED, or UNDECIDED when the ratio is only a lower bound (sampled never
    reached 99 %) below the goal, or replay itself never got there."""
    if not final_ok:
        return "MISSED"
    if note in ("", "≥ ") and ratio >= GOAL_SPEEDUP:
        return "MET"
    if note == "":
        return "MISSED"
    return "UNDECIDED (a bound only)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="demo,cranfield")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=40, help="trials of each sampled study (default 40)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 15 trials, demo only")
    ap.add_argument("--apply", default="reload",
                    help="how trials get their config served: reload, restart, or reload,restart (default reload)")
    ap.add_argument("--keep", type=Path, help="set up in this folder and keep it (default: a temp folder)")
    args = ap.parse_args()
    if args.quick:
        args.datasets, args.seeds, args.trials = "demo", 1, 15
    quiet()
    started = time.perf_counter()
    load_before = os.getloadavg()
    code = code_fingerprint()
    print(f"replay bench: datasets {args.datasets}, trials {args.apply}, {args.seeds} seeds, sampled {args.trials} "
          f"trials, replay {REPLAY_TRIALS} asked; {os.cpu_count()} cores, load average {load_before[0]:.2f}; code {code}", flush=True)
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        modes = args.apply.split(",")
        if not set(modes) <= {"reload", "restart"}:
            raise SystemExit(f"--apply {args.apply}: give reload, restart or reload,restart")
        results = {f"{n} ({mode})": r for n in args.datasets.split(",")
                   for mode, r in bench_dataset(n, work, args.seeds, args.trials, modes).items()}
    load_after = os.getloadavg()
    print("\n== summary (medians)")
    print(table(["dataset", "grid optimum", "final sampled", "final replay", "time to 99%: sampled, s", "replay, s",
                 "sampled/replay", "mismatches", "goal"],
                [[n, r["optimum"], r["sampled"]["final"], r["replay"]["final"], fmt_bound(*r["sampled"]["time"]),
                  fmt_bound(*r["replay"]["time"]), r["ratio"], r["mismatches"], r["verdict"]]
                 for n, r in results.items()]))
    print(f"load average start / end: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} cores; "
          f"total {time.perf_counter() - started:.0f} s")
    code_end = code_fingerprint()
    print(f"code (tuner/ + backend sources) {code}" + (" unchanged during the run" if code_end == code else
          f" CHANGED during the run (now {code_end}): the numbers mix code versions; run again"))
    return 0 if all(r["verdict"] == "MET" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
