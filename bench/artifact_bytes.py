"""Bytes a study writes per trial: slim reports (the default) vs full reports, on the demo.

Runs `tuner demo` twice in fresh copies of the project (the demo's own experiment, 20
trials; the second with ``tracking.report_detail: full``) and counts what the study
wrote: the trial folders, the Optuna artifact store, the MLflow store (runs database and
artifacts), the Optuna study database and the result cache. Every file is counted once
per inode: the Optuna and MLflow artifacts are hard links to the trial's own files, so a
file stored three times would count three times here and a linked one once. The value
check beside the sizes: both runs end with the same best trial and value (report detail
must not change what is measured), and the number of extra copies (files with the same
bytes under two inodes) is printed.

    .venv/bin/python bench/artifact_bytes.py [--trials 20]

Goal (issue 13): at most 300 KB per trial in total with slim reports.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_BYTES = 300_000
STORES = ("trials", "optuna-artifacts", "optuna.db", "result-cache.sqlite")


def copy_project(dest: Path, detail: str) -> Path:
    """The files `tuner demo` needs, with the experiment's report detail set."""
    for folder in ("experiments", "search_space"):
        shutil.copytree(REPO / folder, dest / folder)
    (dest / "backend").mkdir()
    shutil.copy2(REPO / "backend" / "config.yaml", dest / "backend" / "config.yaml")
    experiment = dest / "experiments" / "demo.yaml"
    text = experiment.read_text()
    if detail == "full":
        marker = "tracking:\n  enabled: true\n"
        if marker not in text:
            raise SystemExit(f"{experiment}: no 'tracking: enabled: true' block to extend; update this bench")
        text = text.replace(marker, marker + "  report_detail: full\n")
    experiment.write_text(text)
    return dest


def run_demo(project: Path, n_trials: int) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tuner", "demo", "--n-trials", str(n_trials)], cwd=project,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"tuner demo failed in {project} ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def measure(project: Path) -> dict[str, float]:
    """Bytes per store (each inode once), duplicated bytes, trials, best trial/value."""
    import optuna

    state = project / ".tuner" / "demo"
    seen: set[tuple[int, int]] = set()
    sizes: dict[str, int] = {}
    digests: Counter[str] = Counter()
    roots = [state / s for s in STORES] + [project / "mlruns"]
    for root in roots:
        total = 0
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
        for f in files:
            st = f.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
            if st.st_size > 4096 and root.name != "optuna.db" and not f.name.endswith((".db", ".sqlite")):
                digests[hashlib.sha256(f.read_bytes()).hexdigest()] += 1
        sizes[root.name] = total
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{state / 'optuna.db'}")
    from tuner.study.feasibility import best_feasible_trial

    best = best_feasible_trial(study.get_trials(deepcopy=False), maximize=True)
    dup = sum(n - 1 for n in digests.values() if n > 1)
    full_dirs = [d for d in (state / "trials" / "demo").iterdir()
                 if (d / "report.json").is_file() and '"detail": "full"' in (d / "report.json").read_text()[:200]]
    full_bytes = sum(f.stat().st_size for d in full_dirs for f in d.iterdir())
    return {**sizes, "n_trials": len(study.trials), "best": best.number if best else -1,
            "best_value": best.values[0] if best else float("nan"), "duplicate_files": dup,
            "n_full": len(full_dirs), "full_bytes": full_bytes}


def empty_stores(work: Path) -> int:
    """Bytes of an empty Optuna study database and an empty MLflow store: set-up, not per trial."""
    import optuna
    from mlflow import MlflowClient

    optuna.create_study(storage=f"sqlite:///{work / 'optuna.db'}")
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    client.create_experiment("empty")
    return (work / "optuna.db").stat().st_size + (work / "mlflow.db").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="artifact-bytes-") as tmp:
        for detail in ("slim", "full"):
            project = copy_project(Path(tmp) / detail, detail)
            seconds = run_demo(project, args.trials)
            results[detail] = measure(project) | {"seconds": seconds}
        (Path(tmp) / "empty").mkdir()
        fixed = empty_stores(Path(tmp) / "empty")
    load = os.getloadavg()[0]
    print(f"bytes written by a {args.trials}-trial demo study (each inode once), load average {load:.2f}")
    rows = [*STORES, "mlruns"]
    print(f"{'store':<22}{'slim':>14}{'full':>14}")
    for key in rows:
        print(f"{key:<22}{results['slim'][key]:>14,.0f}{results['full'][key]:>14,.0f}")
    per = {d: sum(r[k] for k in rows) / r["n_trials"] for d, r in results.items()}
    # per trial without the empty stores' own size (a study's set-up, paid once)
    net = {d: (sum(r[k] for k in rows) - fixed) / r["n_trials"] for d, r in results.items()}
    print(f"{'total / trial':<22}{per['slim']:>14,.0f}{per['full']:>14,.0f}")
    print(f"{'  w/o empty stores':<22}{net['slim']:>14,.0f}{net['full']:>14,.0f}   (empty Optuna + MLflow stores: "
          f"{fixed:,} bytes)")
    s = results["slim"]
    slim_each = (sum(s[k] for k in rows) - fixed - s["full_bytes"]) / (s["n_trials"] - s["n_full"])
    projected = fixed + s["full_bytes"] + slim_each * (1000 - s["n_full"])
    print(f"{'full report folders':<22}{s['n_full']:>14.0f}{results['full']['n_full']:>14.0f}   (slim run: the baseline "
          "and the best so far; each earlier best was rewritten slim)")
    print(f"1,000-trial study, projected from the slim run: {projected / 1e6:,.0f} MB "
          f"({slim_each:,.0f} bytes per slim trial, the full folders and the stores once); "
          f"full detail: {per['full'] * 1000 / 1e6:,.0f} MB")
    print(f"{'files stored twice':<22}{results['slim']['duplicate_files']:>14.0f}{results['full']['duplicate_files']:>14.0f}")
    print(f"{'demo wall time (s)':<22}{results['slim']['seconds']:>14.1f}{results['full']['seconds']:>14.1f}")
    same = (results["slim"]["best"] == results["full"]["best"]
            and abs(results["slim"]["best_value"] - results["full"]["best_value"]) < 1e-12)
    print(f"value check: best trial #{results['slim']['best']:.0f} {results['slim']['best_value']:.4f} (slim) vs "
          f"#{results['full']['best']:.0f} {results['full']['best_value']:.4f} (full): {'same' if same else 'DIFFERENT'}")
    print(f"GOAL <= {GOAL_BYTES:,} bytes per trial (slim, w/o the empty stores): {net['slim']:,.0f} -> "
          f"{'MET' if net['slim'] <= GOAL_BYTES else 'MISSED'}; with them {per['slim']:,.0f} "
          f"(full/slim ratio {per['full'] / per['slim']:.1f}x)")


if __name__ == "__main__":
    main()
