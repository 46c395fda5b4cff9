"""`tuner eval` and `tuner labels` as a user runs them: real subprocesses, a real
HTTP service on loopback, a real SQLite label cache."""

import csv
import json
import subprocess
import sys

import pytest
from support.fake_search import FakeSearch

N_IN = 5  # judged in-scope queries
N_OOS = 5  # enough out-of-scope queries for an OOS gate to mean something
N = N_IN + N_OOS


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _payload(i):
    return {"results": [{"doc_id": f"d{i}-{j}", "score": 1 - j / 10, "title": f"Doc {i}-{j}"} for j in range(8)],
            "confidence": 0.4 + 0.07 * i, "handoff": i >= N_IN, "fallback_level": 0}


@pytest.fixture
def workspace(tmp_path):
    queries = tmp_path / "demo.jsonl"
    queries.write_text("".join(
        json.dumps({"query_id": f"q{i}", "query": f"text {i}", "query_type": "short" if i % 2 else "long",
                    "source": "faq", "scope": "oos" if i >= N_IN else "in", "date_hint_days": 7}) + "\n"
        for i in range(N)))
    labels = tmp_path / "labels.qrels"
    labels.write_text("".join(f"q{i} 0 d{i}-{j} {(j + 1) % 4}\n" for i in range(N_IN) for j in range(0, 8, 2)))
    with FakeSearch({f"text {i}": _payload(i) for i in range(N)}) as svc:
        yield tmp_path, queries, labels, svc


def _import(tmp_path, labels):
    out = tuner("labels", "import", labels, "--db", tmp_path / "labels.db", "--dataset-id", "demo", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return out


def test_labels_import_and_stats(workspace):
    tmp_path, _, labels, _ = workspace
    out = _import(tmp_path, labels)
    assert f"imported {4 * (N_IN)} labels for {N_IN} queries" in out.stdout
    stats = tuner("labels", "stats", "--db", tmp_path / "labels.db", "--dataset-id", "demo", "--per-query", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert f"demo: {4 * (N_IN)} labels, {N_IN} queries judged" in stats.stdout
    assert "fingerprint" in stats.stdout


def test_labels_import_bad_row_is_one_line_and_changes_nothing(workspace):
    tmp_path, _, labels, _ = workspace
    _import(tmp_path, labels)
    bad = tmp_path / "bad.qrels"
    bad.write_text("q1 0 d1-1 2\nq1 0 d1-3 9\n")
    out = tuner("labels", "import", bad, "--db", tmp_path / "labels.db", "--dataset-id", "demo", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "bad.qrels:2: grade 9 is not in the grade map" in out.stderr
    stats = tuner("labels", "stats", "--db", tmp_path / "labels.db", "--dataset-id", "demo", cwd=tmp_path)
    assert f"demo: {4 * (N_IN)} labels" in stats.stdout


def test_eval_writes_reports_and_passes_gates(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    snapshot = tmp_path / "config.yaml"
    snapshot.write_text("fusion:\n  rrf_k: 60\n")
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--dataset-id", "demo",
                "--url", svc.url, "--out", tmp_path / "rep", "--top-k", 8, "--concurrency", 3,
                "--confidence-field", "confidence", "--handoff-field", "handoff", "--fallback-field", "fallback_level",
                "--config-snapshot", snapshot, "--fail-under", "Primary_Metric_Score=0.01",
                "--fail-over", "OOS_FP_Rate=0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "all 2 gate(s) passed" in out.stdout
    for name in ("report.json", "report.md", "report_per_query.csv", "report_pr_curve.png"):
        assert (tmp_path / "rep" / name).is_file(), name
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["context"]["url"] == svc.url and report["context"]["gates"][0]["passed"] is True
    assert report["config_snapshot"] == "fusion:\n  rrf_k: 60\n"
    assert report["scorecard"]["N_Queries"] == N and report["scorecard"]["OOS_FP_Rate"] == 0.0
    sent = {r.body["query"]: r for r in svc.requests}
    assert sent["text 2"].body == {"query": "text 2", "top_k": 8, "date_hint_days": 7}
    by_id = {q["query_id"]: q for q in report["queries"]}
    assert by_id["q2"]["request_id"] == sent["text 2"].headers["X-Request-ID"]


def test_missed_gates_exit_non_zero_with_a_line_each(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--url", svc.url,
                "--out", tmp_path / "rep", "--fail-under", "Primary_Metric_Score=0.99",
                "--fail-over", "OOS_FP_Rate=-1", "--fail-under", "NDCG@20=0", cwd=tmp_path)
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.startswith("gate missed")]
    assert len(lines) == 2
    assert lines[0].startswith("gate missed: Primary_Metric_Score = ") and "is below 0.99" in lines[0]
    # no --handoff-field: an OOS query with results counts as answered
    assert lines[1] == "gate missed: OOS_FP_Rate = 1.0000 is above -1 (required OOS_FP_Rate <= -1)"
    assert (tmp_path / "rep" / "report.json").is_file()  # the report is written before the verdict


def test_unknown_gate_metric_fails_before_any_request(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--url", svc.url,
                "--fail-under", "Primary_Metric=0.5", cwd=tmp_path)
    assert out.returncode == 2 and "unknown metric 'Primary_Metric'" in out.stderr
    assert svc.requests == []


def test_eval_with_spec_file_and_export_unjudged(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    svc.responses = {f"text {i}": {"payload": {"items": [{"ref": h["doc_id"], "name": h["title"]}
                                                         for h in _payload(i)["results"]]}} for i in range(N)}
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "request:\n"
        f"  url: {svc.url}\n"
        "  body: {query: '{query}', size: '{top_k}', tag: 'eval-{query_id}', days: '{date_hint_days}'}\n"
        "  pass_extra: false\n"
        "response:\n  results_path: payload.items\n  doc_id: ref\n  title: name\n  score: null\n"
        "top_k: 5\nmax_failed_queries: 0\n"
    )
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--spec", spec,
                "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert svc.requests[0].body["size"] == 5 and svc.requests[0].body["tag"].startswith("eval-q")
    assert svc.requests[0].body["days"] == 7  # pass_extra: false, so the template sends it

    todo = tmp_path / "todo.csv"
    out = tuner("labels", "export-unjudged", "--report", tmp_path / "rep" / "report.json", "--out", todo,
                "--db", tmp_path / "labels.db", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(todo.open()))
    # every in-scope query returned 8 docs, cut to top_k 5; of those, the odd ones are unlabelled;
    # OOS hits are not exported
    assert len(rows) == N_IN * 2
    assert {r["doc_id"] for r in rows if r["query_id"] == "q0"} == {"d0-1", "d0-3"}
    assert rows[0]["query"] == "text 0" and rows[0]["title"].startswith("Doc 0-")


def test_eval_stops_when_the_query_set_carries_fields_the_request_never_sends(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"request:\n  url: {svc.url}\n  body: {{query: '{{query}}'}}\n  pass_extra: false\n")
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--spec", spec,
                "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "fields the request never sends: date_hint_days (10 queries)" in out.stderr
    assert svc.requests == []  # found before any traffic


def test_spec_file_typo_is_located(workspace):
    tmp_path, queries, labels, svc = workspace
    _import(tmp_path, labels)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"request:\n  url: {svc.url}\nresponse:\n  result_path: hits\n")
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--spec", spec, cwd=tmp_path)
    assert out.returncode == 2 and "spec.yaml:4: response.result_path: unknown key (did you mean results_path?)" in out.stderr


def test_eval_failure_budget_and_missing_labels_exit_2(workspace):
    tmp_path, queries, labels, svc = workspace
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--url", svc.url, cwd=tmp_path)
    assert out.returncode == 2 and "no label database here" in out.stderr
    assert not (tmp_path / "labels.db").exists()  # a typo does not create an empty database
    _import(tmp_path, labels)
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--dataset-id", "other",
                "--url", svc.url, cwd=tmp_path)
    assert out.returncode == 2 and "no labels for dataset 'other' (datasets with labels: demo)" in out.stderr
    assert svc.requests == []
    svc.fail_always.update({"text 0", "text 1"})
    out = tuner("eval", "--queries", queries, "--labels-db", tmp_path / "labels.db", "--url", svc.url,
                "--retries", 0, "--max-failed", 1, "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 2 and f"2 of {N} queries failed, the budget allows 1" in out.stderr
    assert not (tmp_path / "rep").exists()


def _experiment(tmp_path, labels, url):
    (tmp_path / "config.yaml").write_text("fusion:\n  rrf_k: 60  # RRF constant\n")
    (tmp_path / "space.yaml").write_text("params:\n  fusion.rrf_k: {type: int, low: 5, high: 100}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "study: eval-from-experiment\nn_trials: 1\n"
        f"dataset: {{queries: demo.jsonl, labels: [{{path: {labels.name}, format: qrels}}]}}\n"
        "target:\n  config_files: [config.yaml]\n  apply: none\n  health: {url: 'http://127.0.0.1:{port}/health'}\n"
        f"evaluation:\n  request: {{url: '{url}'}}\n"
        "  response: {confidence: confidence, handoff: handoff, fallback_level: fallback_level}\n  top_k: 8\n"
        "search_space: space.yaml\n"
    )
    return exp


def test_eval_takes_queries_labels_and_mapping_from_an_experiment(workspace):
    tmp_path, _, labels, svc = workspace
    exp = _experiment(tmp_path, labels, svc.url)
    out = tuner("eval", "--experiment", exp, "--out", tmp_path / "rep", "--fail-over", "OOS_FP_Rate=0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    # the labels were imported from the experiment's declared label file (none existed before)
    assert report["scorecard"]["N_Queries"] == N
    assert report["scorecard"]["Judged@10"] > 0
    # the response mapping came from the experiment: the one OOS query was handed off
    assert report["scorecard"]["OOS_FP_Rate"] == 0.0
    assert {r.body["top_k"] for r in svc.requests} == {8}


def test_eval_experiment_with_port_placeholder_needs_port(workspace):
    tmp_path, _, labels, _ = workspace
    exp = _experiment(tmp_path, labels, "http://127.0.0.1:{port}/search")
    out = tuner("eval", "--experiment", exp, "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 2
    assert "pass --port N" in out.stderr and out.stderr.strip().count("\n") == 0


# ------------------------------------------- issue 26 item 5 / issue 27 item 10: --experiment


def test_eval_experiment_flags_override_its_dataset(workspace):
    """--queries, --dataset-id and --labels-db win over the experiment's dataset section."""
    tmp_path, queries, labels, svc = workspace
    exp = _experiment(tmp_path, labels, svc.url)
    sub = tmp_path / "sub.jsonl"
    sub.write_text("".join(queries.read_text().splitlines(keepends=True)[2:]))  # q2..q9: 3 in scope, 5 OOS
    other_db = tmp_path / "other" / "labels.db"
    out = tuner("eval", "--experiment", exp, "--queries", sub, "--dataset-id", "demo", "--labels-db", other_db,
                "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["scorecard"]["N_Queries"] == N - 2
    assert {r.body["query"] for r in svc.requests} == {f"text {i}" for i in range(2, N)}
    ctx = report["context"]
    assert ctx["queries_file"] == str(sub) and ctx["labels_db"] == str(other_db) and ctx["dataset_id"] == "demo"
    assert other_db.is_file() and not (tmp_path / ".tuner" / "labels.db").exists()  # the experiment's labels went there


def test_eval_experiment_with_another_query_set_does_not_grade_it_with_the_experiments_labels(workspace):
    tmp_path, queries, labels, svc = workspace
    exp = _experiment(tmp_path, labels, svc.url)
    other = tmp_path / "next-year.jsonl"
    other.write_text(queries.read_text())
    out = tuner("eval", "--experiment", exp, "--queries", other, "--out", tmp_path / "rep", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "no labels for dataset 'next-year'" in out.stderr and "tuner labels import" in out.stderr
    assert not svc.requests


@pytest.fixture(scope="module")
def reference_project(tmp_path_factory):
    """The reference backend as the experiment's process target, on the demo data."""
    import importlib.util

    from support.integration import need

    need(importlib.util.find_spec("fusion_backend") is not None, "reference backend package not installed (./dev setup)")
    from support.demo_data import copy_demo_data
    from support.reference_experiment import copy_backend_config, write_reference_experiment

    root = tmp_path_factory.mktemp("eval-starts-backend")
    copy_demo_data(root / "data")
    config = copy_backend_config(root)
    exp = write_reference_experiment(root, study="eval", n_trials=1, project_root=".",
                                     evaluation={"top_k": 20, "concurrency": 4})
    return root, exp, config


def test_eval_experiment_starts_and_stops_its_backend_as_check_does(reference_project):
    """No --port: the experiment's backend is started on the config as found, measured,
    and stopped; the numbers are those of the same backend started by hand."""
    import httpx
    from support.backend import start_backend

    root, exp, config = reference_project
    original = config.read_bytes()
    out = tuner("eval", "--experiment", exp, "--out", root / "rep", cwd=root)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "starting the backend on the config as found (target.apply process); it is stopped after the batch" \
        in out.stdout
    report = json.loads((root / "rep" / "report.json").read_text())
    url = report["context"]["url"]
    assert "{port}" not in url and report["scorecard"]["Failed_Queries"] == 0
    with pytest.raises(httpx.TransportError):  # stopped again
        httpx.get(url.replace("/search", "/health"), timeout=2)
    assert config.read_bytes() == original
    with start_backend(config) as backend:
        by_hand = tuner("eval", "--experiment", exp, "--port", backend.port, "--out", root / "rep2", cwd=root)
    assert by_hand.returncode == 0, by_hand.stderr
    assert "starting the backend" not in by_hand.stdout
    again = json.loads((root / "rep2" / "report.json").read_text())["scorecard"]
    for key in ("Primary_Metric_Score", "NDCG@20", "OOS_FP_Rate", "N_Queries"):
        assert report["scorecard"][key] == pytest.approx(again[key], abs=1e-12), key
