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


def test_map_points_to_ap_not_the_graded_map(datasets_dir):
    ref = datasets_dir / "trec_eval_reference"
    done = tuner("score", "--qrels", str(ref / "qrels.test"), "--run", str(ref / "results.test"), "--metrics", "MAP")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "trec_eval's map is AP here" in done.stderr and "use AP" in done.stderr
    assert "e.g. MAP@10" not in done.stderr


def test_list_metrics_shows_every_family_with_its_trec_eval_measure():
    done = tuner("score", "--list-metrics")
    assert done.returncode == 0
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.count("│") > 3}
    for family in ("NDCG", "ERR", "Strong_Precision", "Avg_Grade", "Gain_Recall", "MAP", "AP", "Judged"):
        assert family in rows
    assert "map_cut_k; bare: map" in rows["AP"]
    assert "none (trec_eval map / map_cut_k = our AP / AP@k)" in rows["MAP"]
    assert "ndcg_cut_k" in rows["NDCG"] and "P_k" in rows["P"] and "recall_k" in rows["Recall"]


# out.test.aql is `trec_eval -l2` on qrels.rel_level (grades -1..4). The CLI scale is
# 0..3, so grade 4 folds into 3: that moves no binary measure at -l 2 (both count).
REL_LEVEL_MAP = "-1:unjudged,0:0,1:1,2:2,3:3,4:3"
BINARY_AT_L2 = {"P@5": "P_5", "P@10": "P_10", "AP": "map", "AP@10": "map_cut_10", "MRR": "recip_rank",
                "Recall@100": "recall_100", "Success@1": "success_1", "P@20": "P_20"}


def test_relevance_level_two_reproduces_trec_eval_l2(datasets_dir, tmp_path):
    ref = datasets_dir / "trec_eval_reference"
    aql = ref / "out.test.aql"
    scores = {}
    for flag in ("-l", "--relevance-level"):
        for level in ("1", "2"):
            out = tmp_path / f"{flag}{level}.json"
            done = tuner("score", "--qrels", str(ref / "qrels.rel_level"), "--run", str(ref / "results.test"),
                         "--grade-map", REL_LEVEL_MAP, flag, level, "--metrics", ",".join([*BINARY_AT_L2, "NDCG"]),
                         "--json", str(out))
            assert done.returncode == 0, done.stderr
            scores[flag, level] = json.loads(out.read_text())
    at_two = scores["-l", "2"]
    assert at_two["relevance_level"] == 2 and "relevant: grade >= 2" in done.stdout
    assert at_two == {**scores["--relevance-level", "2"], "relevance_level": 2}
    for ours, theirs in BINARY_AT_L2.items():
        for qid in ("301", "302", "303"):
            assert at_two["per_query"][qid][ours] == pytest.approx(trec_eval_value(aql, theirs, qid), abs=0.5e-4)
        assert at_two["aggregate"][ours] == pytest.approx(trec_eval_value(aql, theirs, "all"), abs=0.5e-4)
    # -l leaves NDCG alone, as trec_eval's ndcg; 302 and 303 have no grade 4 to fold.
    for qid in ("301", "302", "303"):
        assert at_two["per_query"][qid]["NDCG"] == scores["-l", "1"]["per_query"][qid]["NDCG"]
    for qid in ("302", "303"):
        assert at_two["per_query"][qid]["NDCG"] == pytest.approx(trec_eval_value(aql, "ndcg", qid), abs=0.5e-4)
    assert at_two["aggregate"]["AP"] != scores["-l", "1"]["aggregate"]["AP"]


def trec_rows(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def write_json_array(rows: list[list[str]], path: Path) -> None:
    """The run as RankGPT-style JSON: hits reversed and renumbered, so only scores can order them."""
    by_query: dict[str, list[dict]] = {}
    for qid, _q0, docno, _rank, score, _tag in rows:
        by_query.setdefault(qid, []).append({"qid": qid, "docid": docno, "score": float(score), "content": "..."})
    path.write_text(json.dumps([{"query": f"topic {qid}", "hits": [{**hit, "rank": rank} for rank, hit in
                                enumerate(reversed(hits), 1)]} for qid, hits in by_query.items()]))


def write_pyserini_jsonl(rows: list[list[str]], path: Path) -> None:
    path.write_text("".join(json.dumps({"qid": q, "docid": d, "rank": int(r), "score": float(s)}) + "\n"
                            for q, _, d, r, s, _ in reversed(rows)))


@pytest.mark.parametrize("writer", [write_json_array, write_pyserini_jsonl])
def test_json_runs_score_exactly_like_the_same_run_as_trec_lines(datasets_dir, tmp_path, writer):
    ref = datasets_dir / "trec_eval_reference"
    converted = tmp_path / "run.json"
    writer(trec_rows(ref / "results.test"), converted)
    reports = {}
    for name, run in (("trec", ref / "results.test"), ("json", converted)):
        out = tmp_path / f"{name}.json"
        done = tuner("score", "--qrels", str(ref / "qrels.test"), "--run", str(run), "--grade-map", "0:0,1:1",
                     "--json", str(out))
        assert done.returncode == 0, done.stderr
        reports[name] = json.loads(out.read_text())
    assert reports["json"]["run_format"] in ("json", "jsonl") and reports["trec"]["run_format"] == "trec"
    assert reports["json"]["per_query"] == reports["trec"]["per_query"]  # exactly, not approximately
    assert reports["json"]["aggregate"] == reports["trec"]["aggregate"]


def test_given_order_scores_captured_responses_in_api_order(tmp_path):
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 3\n")
    run = tmp_path / "captured.jsonl"  # API order puts a first though its score is lower
    run.write_text('{"query_id": "1", "results": [{"doc_id": "a", "score": 0.2}, {"doc_id": "b", "score": 0.9}]}\n')
    out = tmp_path / "s.json"
    for order, expected in (("trec", 0.0), ("given", 1.0)):
        assert tuner("score", "--qrels", str(qrels), "--run", str(run), "--metrics", "P@1", "--order", order,
                     "--json", str(out)).returncode == 0
        report = json.loads(out.read_text())
        assert report["order"] == order and report["aggregate"]["P@1"] == expected


@pytest.mark.parametrize("content,args,message", [
    ('[{"query": "t", "hits": [{"qid": "1", "docid": "a", "score": 1}, {"qid": "2", "docid": "b"}]}]', [],
     "r.json: query 1 hit 2: qid 2 differs from the query's 1; give each query its own object"),
    ('[{"qid": "1", "hits": [{"docid": "a", "score": "high"}]}]', [],
     "r.json: query 1 hit 1: score 'high' is not a number"),
    ('[{"qid": "1", "hits": [\n  {"docid": "a" "score": 1}]}]', [], "r.json:2: not valid JSON"),
    ('[{"qid": "1", "hits": []}]', ["-l", "0"], "relevance level 0 is not a grade in 1..3"),
    ('[{"qid": "1", "hits": []}]', ["--order", "rank"], "--order 'rank' is not one of: trec, given"),
])
def test_bad_run_or_option_is_a_one_line_error_and_writes_nothing(tmp_path, content, args, message):
    qrels = tmp_path / "q.txt"
    qrels.write_text("1 0 a 3\n")
    run = tmp_path / "r.json"
    run.write_text(content)
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, "-m", "tuner", "score", "--qrels", "q.txt", "--run", "r.json", *args,
                           "--json", "s.json"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert message in done.stderr
    assert not out.exists()
