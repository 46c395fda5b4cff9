"""`tuner score` through the real console entry point (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})


def trec_eval_value(path: Path, measure: str, qid: str) -> float:
    for line in path.read_text().splitlines():
        name, query, value = line.split()
        if (name, query) == (measure, qid):
            return float(value)
    raise AssertionError(f"{measure} {qid} not in {path}")


def test_score_reproduces_trec_eval_reference_values(datasets_dir, tmp_path):
    ref = datasets_dir / "trec_eval_reference"
    out = tmp_path / "scores.json"
    done = tuner("score", "--qrels", str(ref / "qrels.test"), "--run", str(ref / "results.test"),
                 "--grade-map", "0:0,1:1", "--metrics", "NDCG,NDCG@10,NDCG@20,NDCG@23,P@5,MRR,AP",
                 "--per-query", "--json", str(out))
    assert done.returncode == 0, done.stderr
    scores = json.loads(out.read_text())
    assert scores["grade_map"] == "0:0,1:1" and scores["gains"] == "linear"
    assert list(scores["per_query"]) == ["301", "302", "303"]
    pairs = {"NDCG": ("out.test.aq", "ndcg"), "NDCG@10": ("out.test.aq", "ndcg_cut_10"),
             "NDCG@20": ("out.test.aq", "ndcg_cut_20"), "NDCG@23": ("out.test.meas_params", "ndcg_cut_23"),
             "P@5": ("out.test.aq", "P_5"), "MRR": ("out.test.aq", "recip_rank"), "AP": ("out.test.aq", "map")}
    for ours, (file, theirs) in pairs.items():
        for qid in ("301", "302", "303"):
            assert scores["per_query"][qid][ours] == pytest.approx(trec_eval_value(ref / file, theirs, qid), abs=0.5e-4)
        if file == "out.test.aq":
            assert scores["aggregate"][ours] == pytest.approx(trec_eval_value(ref / file, theirs, "all"), abs=0.5e-4)
    assert f"{scores['aggregate']['NDCG@10']:.4f}" in done.stdout  # the printed scorecard
    assert "Per query" in done.stdout


def test_score_counts_a_query_missing_from_the_run_as_zero(tmp_path):
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 3\n1 0 b 1\n2 0 c 2\n")
    run = tmp_path / "r.jsonl"
    run.write_text('{"query_id": "1", "results": [{"doc_id": "a", "score": 2}, {"doc_id": "x", "score": 1}]}\n')
    out = tmp_path / "s.json"
    assert tuner("score", "--qrels", str(qrels), "--run", str(run), "--metrics", "P@1",
                 "--json", str(out)).returncode == 0
    assert json.loads(out.read_text())["aggregate"]["P@1"] == pytest.approx((1 + 0) / 2)
    assert tuner("score", "--qrels", str(qrels), "--run", str(run), "--metrics", "P@1", "--queries", "common",
                 "--json", str(out)).returncode == 0
    assert json.loads(out.read_text())["aggregate"]["P@1"] == pytest.approx(1.0)


def test_bad_qrels_line_is_a_one_line_error_and_writes_nothing(tmp_path):
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 3\n1 0 b 7\n")
    run = tmp_path / "r.run"
    run.write_text("1 Q0 a 1 1.0 t\n")
    out = tmp_path / "s.json"
    done = tuner("score", "--qrels", str(qrels), "--run", str(run), "--json", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"{qrels}:2: grade 7 is not in the grade map" in done.stderr
    assert set(tmp_path.iterdir()) == {qrels, run}  # no report, no temp file


def test_unknown_metric_is_an_error_with_a_suggestion(datasets_dir):
    ref = datasets_dir / "trec_eval_reference"
    done = tuner("score", "--qrels", str(ref / "qrels.test"), "--run", str(ref / "results.test"), "--metrics", "ndcg@10")
    assert done.returncode == 2
    assert "unknown metric 'ndcg@10' (did you mean NDCG?)" in done.stderr


def test_list_metrics_shows_every_family():
    done = tuner("score", "--list-metrics")
    assert done.returncode == 0
    for family in ("NDCG", "ERR", "Strong_Precision", "Avg_Grade", "Gain_Recall", "MAP", "Judged"):
        assert family in done.stdout
