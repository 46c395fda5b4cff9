"""`tuner labels import --replace`, its refusal without, the conflict note, and `tuner eval`
stopping on a label file changed since its import (before any request is sent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _tuner(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400"})  # tmp paths are long under xdist


def test_import_replace_refusal_and_the_conflict_note(tmp_path: Path) -> None:
    (tmp_path / "qrels.txt").write_text("q1 0 d1 2\nq1 0 d2 0\n")
    assert _tuner(tmp_path, "labels", "import", "qrels.txt", "--dataset-id", "demo").returncode == 0
    (tmp_path / "graded.csv").write_text("query_id,doc_id,relevance\nq1,d7,3\n")
    from tuner.data.labels import LabelStore
    from tuner.ops.labelqueue import import_graded

    import_graded(LabelStore(tmp_path / ".tuner" / "labels.db"), tmp_path / "graded.csv", "demo")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 2\nq1 0 d7 1\n")  # d2 dropped, d7 graded unlike the grader

    refused = _tuner(tmp_path, "labels", "import", "qrels.txt", "--dataset-id", "demo")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: qrels.txt was imported into .tuner/labels.db (dataset demo) before and its judgments changed since "
        "(1 added, 0 changed, 1 removed); pass --replace to replace this file's judgments (other files' and "
        "graders' grades are kept)")

    done = _tuner(tmp_path, "labels", "import", "qrels.txt", "--dataset-id", "demo", "--replace")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("replaced this file's judgments: 1 added, 0 changed, 1 removed since its last import")
    assert lines[2] == (
        "note: 1 (query, doc) pair(s) of demo are graded differently by a label file and by graders (tuner labels "
        "queue-import); the graders' grades are kept: see them with `tuner labels stats --dataset-id demo --db "
        ".tuner/labels.db --conflicts`")
    stats = _tuner(tmp_path, "labels", "stats", "--dataset-id", "demo", "--conflicts")
    assert stats.returncode == 0 and "1 pair(s) graded differently by a file and by graders (graders' kept)" in stats.stdout
    row = next(line for line in stats.stdout.splitlines() if " d7 " in line)
    assert [cell.strip() for cell in row.split("│")[1:6]] == ["q1", "d7", "1", str(tmp_path / "qrels.txt"), "3"]


def test_eval_stops_on_an_imported_file_changed_since(tmp_path: Path) -> None:
    (tmp_path / "demo.jsonl").write_text(json.dumps({"query_id": "q1", "query": "wing", "query_type": "short",
                                                     "source": "t", "scope": "in"}) + "\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 2\nq1 0 d2 0\n")
    assert _tuner(tmp_path, "labels", "import", "qrels.txt", "--dataset-id", "demo").returncode == 0
    (tmp_path / "qrels.txt").write_text("q1 0 d1 3\nq1 0 d2 0\n")
    out = _tuner(tmp_path, "eval", "--queries", "demo.jsonl", "--labels-db", ".tuner/labels.db",
                 "--url", "http://127.0.0.1:9/search")  # never reached: the labels stop it first
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: labels: qrels.txt changed since it was imported into .tuner/labels.db (dataset demo): "
        "0 judgment(s) added, 1 changed, 0 removed; re-import it with `tuner labels import qrels.txt --replace "
        "--dataset-id demo --db .tuner/labels.db --format qrels`, then start a new study (a study's trials measured "
        "on the old labels are not compared with new ones)")
