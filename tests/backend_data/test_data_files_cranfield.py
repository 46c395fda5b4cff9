"""The files importer on real data (skips without ../shared, fails under TUNER_REQUIRE_INTEGRATION=1).

Cranfield is turned into what a user typically holds: a JSONL corpus, JSONL queries,
TREC qrels, and two TREC runs made here by the reference backend's own BM25 and LSA
(scores written at full precision), plus 20 CACM queries as honest out-of-scope ones.
The files importer turns that into a ready bundle, and a real two-trial study runs on
it with the backend as a local process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from support import cranfield_files

from fusion_backend.config import load_config
from fusion_backend.importers import import_trec
from fusion_backend.importers.__main__ import main
from fusion_backend.search import SearchRequest
from tuner.study.trial.attrs import metrics_of

pytestmark = pytest.mark.integration

N_OOS = cranfield_files.N_OOS
_files_argv = cranfield_files.files_argv
_searcher = cranfield_files.searcher


def _run_lines(path: Path) -> list[tuple[str, str, float]]:
    return [(p[0], p[2], float(p[4])) for p in (line.split() for line in path.read_text().splitlines())]


def _trec_eval_order(lines: list[tuple[str, str, float]], query_order: list[str]) -> list[tuple[str, str, float]]:
    """Per query: score descending, ties by docno descending (trec_eval's order)."""
    position = {q: i for i, q in enumerate(query_order)}
    by_doc = sorted(lines, key=lambda r: r[1], reverse=True)
    return sorted(by_doc, key=lambda r: (position[r[0]], -r[2]))


def test_files_import_names_counts_and_labels(cran_bundle, cran_inputs):
    out, stdout = cran_bundle
    assert f"cran: 1400 documents, {225 + N_OOS} queries ({N_OOS} out of scope), 1837 judgments -> {out}" in stdout
    assert "dropped" not in stdout  # every Cranfield query is judged
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "config.yaml", "corpus.jsonl", "cran.qrels.txt", "cran.queries.jsonl", "experiment.yaml",
        "experiment_replay.yaml", "manifest.json", "runs/bm25.run", "runs/lsa.run", "space.yaml"]
    # Grades 0..3 map to themselves (auto), so the labels are the input labels.
    assert (out / "cran.qrels.txt").read_text() == cran_inputs["qrels"].read_text()
    queries = [json.loads(line) for line in (out / "cran.queries.jsonl").open()]
    assert [q["scope"] for q in queries].count("oos") == N_OOS and queries[0]["query_id"] == "1"
    from tuner.data.dataset import load_queryset

    assert load_queryset(out / "cran.queries.jsonl").dataset_id == "cran"


def test_runs_round_trip_at_full_precision(cran_bundle, cran_inputs):
    out, _ = cran_bundle
    query_order = [json.loads(line)["query_id"] for line in (out / "cran.queries.jsonl").open()]
    for name in ("bm25", "lsa"):
        source = _run_lines(cran_inputs[name])
        # The runs are real-looking: scores that only the 7th+ significant digit separates.
        collisions = sum(len({s for q, _, s in source if q == qid}) - len({f"{s:.6g}" for q, _, s in source if q == qid})
                         for qid in query_order)
        written = _run_lines(out / "runs" / f"{name}.run")
        assert written == _trec_eval_order(source, query_order)  # every score exact, trec_eval's order
        assert name != "bm25" or collisions > 0, "the BM25 run should have scores equal at 6 digits"


def test_a_real_trec_run_round_trips_exactly(datasets_dir: Path, tmp_path: Path):
    """trec_eval's own test run: 7-digit scores, one pair of them equal at 6 digits."""
    reference = datasets_dir / "trec_eval_reference"
    source = _run_lines(reference / "results.test")
    qids = list(dict.fromkeys(q for q, _, _ in source))
    (tmp_path / "topics.tsv").write_text("".join(f"{q}\ttopic {q}\n" for q in qids))
    _, files = import_trec(tmp_path / "topics.tsv", reference / "qrels.test", runs=[f"std={reference / 'results.test'}"])
    (tmp_path / "std.run").write_text(files["runs/std.run"])
    assert _run_lines(tmp_path / "std.run") == _trec_eval_order(source, qids)
    six = [(q, f"{s:.6g}") for q, _, s in source]
    assert len(set(six)) < len({(q, s) for q, _, s in source})  # the old .6g rewrite made a tie


def test_unjudged_queries_are_dropped_and_counted(cran_inputs, tmp_path: Path, capsys):
    judged = [line for line in cran_inputs["qrels"].read_text().splitlines() if int(line.split()[0]) <= 100]
    (tmp_path / "part.qrels").write_text("\n".join(judged) + "\n")
    argv = _files_argv({**cran_inputs, "qrels": tmp_path / "part.qrels"}, tmp_path / "out")
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "dropped 125 in-scope queries without any judgment" in stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unjudged"]["count"] == 125 and manifest["counts"]["queries_in_scope"] == 100
    assert manifest["counts"]["queries_oos"] == N_OOS  # out-of-scope queries are never dropped


def test_the_generated_experiment_loads_in_the_tuner(cran_bundle):
    from tuner.config.experiment import load_experiment
    from tuner.config.space.loading import load_space

    out, _ = cran_bundle
    exp = load_experiment(out / "experiment.yaml")
    assert exp.dataset.dataset_id == "cran" and [c.name for c in exp.constraints] == ["OOS_FP_Rate <= 0.1"]
    assert exp.evaluation.request.body == {"query": "{query}", "top_k": "{top_k}", "query_id": "{query_id}"}
    assert load_space(exp.search_space, exp.target.config_files)
    cfg = load_config(out / "config.yaml")
    assert sorted(n for n, s in cfg.sources.items() if s.enabled) == ["bm25", "lsa"]
    assert cfg.sources["bm25"].type == "run" and cfg.sources["dense"].enabled is False


@pytest.mark.slow
def test_a_real_study_runs_on_the_import(cran_bundle, tmp_path: Path):
    """`tuner run DIR/experiment.yaml` right after the import: trials recorded, the config restored."""
    src, _ = cran_bundle
    out = tmp_path / "cran"  # a copy: the study writes .tuner/ and mlruns/ into the folder
    subprocess.run(["cp", "-r", str(src), str(out)], check=True)
    original = (out / "config.yaml").read_bytes()
    tuner = Path(sys.executable).parent / "tuner"
    proc = subprocess.run([str(tuner), "run", str(out / "experiment.yaml"), "--n-trials", "2"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "config.yaml").read_bytes() == original
    study = optuna.load_study(study_name="cran", storage=f"sqlite:///{out / '.tuner' / 'optuna.db'}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    # The runs were found by query_id: the baseline (equal-weight RRF of the two runs) scores well above 0.
    baseline = trials[0]
    assert baseline.user_attrs["variant"] == "baseline" and baseline.value > 0.2
    assert metrics_of(baseline)["OOS_FP_Rate"] == 1.0  # threshold 0: every OOS query answered
    assert (out / "mlruns" / "mlflow.db").is_file()


def test_shipped_threshold_hands_off_no_ordinary_cranfield_query(datasets_dir: Path, tmp_path: Path):
    """docs/backend.md's figures: backend/config.yaml on the cranfield importer's corpus."""
    out = tmp_path / "cranfield"
    assert main(["cranfield", "--src", str(datasets_dir / "cranfield"), "--out", str(out)]) == 0
    searcher = _searcher(tmp_path, out / "corpus.jsonl", "shipped", {})
    queries = [json.loads(line) for line in (out / "cranfield.queries.jsonl").open()]
    outcomes = [searcher.search(SearchRequest(q["query"], top_k=50, query_id=q["query_id"])) for q in queries]
    assert sum(o.handoff for o in outcomes) == 0
    # Replayed at the old default 0.6 (confidence does not depend on the threshold): 104 of 225.
    assert sum(o.confidence < 0.6 for o in outcomes) == 104 and len(outcomes) == 225
