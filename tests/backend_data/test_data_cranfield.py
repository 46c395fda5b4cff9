"""Cranfield importer on the real shared collection (skips without ../shared, fails in CI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fusion_backend.importers import CLEVERDON, import_cranfield, write_dataset
from fusion_backend.importers.cranfield import year_date
from fusion_backend.importers.errors import DataFormatError


@pytest.fixture(scope="module")
def cran_dir(datasets_dir: Path) -> Path:
    return datasets_dir / "cranfield"


@pytest.fixture(scope="module")
def cranfield(cran_dir: Path):
    return import_cranfield(cran_dir)


def _raw_query_ids(cran_dir: Path) -> list[str]:
    text = (cran_dir / "cran.qry").read_bytes().decode()
    return re.findall(r"^\.I\s+(\S+)", text, flags=re.M)


def test_counts_match_the_collection(cranfield, cran_dir):
    raw_doc_ids = re.findall(rb"^\.I\s+(\d+)", (cran_dir / "cran.all.1400").read_bytes(), flags=re.M)
    assert len(cranfield.documents) == len(raw_doc_ids) == 1400
    assert [d.doc_id for d in cranfield.documents] == [i.decode() for i in raw_doc_ids]
    assert len(cranfield.queries) == len(_raw_query_ids(cran_dir)) == 225
    assert all(q.scope == "in" and q.source == "cranfield" for q in cranfield.queries)


def test_queries_are_numbered_by_position_as_cranqrel_numbers_them(cranfield, cran_dir):
    raw_ids = _raw_query_ids(cran_dir)
    # The fact that bites: cran.qry's own ids skip numbers, so they are not positions.
    assert [int(i) for i in raw_ids] != list(range(1, len(raw_ids) + 1))
    assert max(int(i) for i in raw_ids) > len(raw_ids)
    qrel_qids = {int(line.split()[0]) for line in (cran_dir / "cranqrel").read_text().splitlines() if line.strip()}
    assert qrel_qids == set(range(1, len(raw_ids) + 1))  # cranqrel uses positions 1..225
    assert [q.query_id for q in cranfield.queries] == [str(i) for i in range(1, 226)]
    assert cranfield.manifest["query_original_ids"] == {str(p): raw for p, raw in enumerate(raw_ids, start=1)}
    # Position 3 is the query whose .I line says 004.
    third = (cran_dir / "cran.qry").read_text().split(".I 004", 1)[1].split(".I ", 1)[0]
    assert cranfield.queries[2].query == " ".join(third.replace(".W", "", 1).split())


def test_grades_follow_the_documented_cleverdon_mapping(cranfield, cran_dir):
    assert CLEVERDON == {1: 3, 2: 2, 3: 1, 4: 1, -1: 0}
    graded = {(j.query_id, j.doc_id): j.grade for j in cranfield.judgments}
    raw = [line.split() for line in (cran_dir / "cranqrel").read_text().splitlines() if line.strip()]
    expected = {(q, str(int(d))): CLEVERDON[int(code)] for q, d, code in raw}
    assert graded == expected
    assert cranfield.counts()["judgments_unknown_doc"] == 0


def test_line_endings_do_not_leak_into_the_data(cranfield, cran_dir):
    raw = (cran_dir / "cranqrel").read_bytes()
    assert b"\r\n" in raw  # the shipped files use CRLF ...
    assert not raw.endswith(b"\n")  # ... and cranqrel's last line has no terminator at all
    last_q, last_d, last_code = raw.split(b"\n")[-1].split()
    graded = {(j.query_id, j.doc_id): j.grade for j in cranfield.judgments}
    assert graded[(last_q.decode(), last_d.decode())] == CLEVERDON[int(last_code)]
    texts = [d.title + d.text + d.attributes["bibliography"] for d in cranfield.documents]
    texts += [q.query for q in cranfield.queries]
    assert not any("\r" in t for t in texts)


def test_mixed_crlf_and_lf_parse_like_plain_lf(tmp_path: Path):
    docs = ".I 1\n.T\nwing flutter .\n.A\nsmith\n.B\nj. ae. scs. 20, 1953, 10.\n.W\nwing flutter at mach 2 .\n"
    docs += ".I 2\n.T\nheat transfer .\n.A\njones\n.B\nuniversity of manchester\n.W\nheat transfer text .\n"
    qry = ".I 001\n.W\nflutter of wings .\n.I 004\n.W\nheat transfer in slabs .\n"
    qrel = "1 1 1\n2 2 4\n2 1 -1\n"
    lf, mixed = tmp_path / "lf", tmp_path / "mixed"
    for folder, convert in ((lf, lambda t: t), (mixed, _alternate_crlf)):
        folder.mkdir()
        (folder / "cran.all.1400").write_bytes(convert(docs).encode())
        (folder / "cran.qry").write_bytes(convert(qry).encode())
        (folder / "cranqrel").write_bytes(convert(qrel).encode())
    a, b = import_cranfield(lf), import_cranfield(mixed)
    assert a.documents == b.documents and a.queries == b.queries and a.judgments == b.judgments
    assert [d.date for d in a.documents] == ["1953-01-01", None]
    assert {(j.query_id, j.doc_id): j.grade for j in a.judgments} == {("1", "1"): 3, ("2", "2"): 1, ("2", "1"): 0}


def _alternate_crlf(text: str) -> str:
    lines = text.split("\n")
    return "".join(line + ("\r\n" if i % 2 else "\n") for i, line in enumerate(lines[:-1])) + lines[-1]


@pytest.mark.parametrize(("note", "expected"), [
    ("j. ae. scs. 25, 1958, 324.", "1958-01-01"),
    ("naca tn.1851, 1949.", "1949-01-01"),  # the report number looks like a year; the last year wins
    ("r + m 1910, august 1943 .", "1943-01-01"),
    ("university of manchester", None),
    ("j. app. phys., 23, 1852, 1390.", None),  # a typo'd year outside 1900..1979
])
def test_year_from_the_b_field(note, expected):
    assert year_date(note) == expected


def test_dates_on_the_real_collection(cranfield):
    first = cranfield.documents[0]
    assert first.attributes["bibliography"] == "j. ae. scs. 25, 1958, 324."
    assert first.date == "1958-01-01"
    dated = [d for d in cranfield.documents if d.date]
    assert all(re.fullmatch(r"19[0-7]\d-01-01", d.date) for d in dated)
    assert all(d.date == year_date(d.attributes["bibliography"]) for d in cranfield.documents)
    assert 1000 < len(dated) < 1400  # most, not all, notes name a year


def test_oos_queries_from_cacm(cran_dir, datasets_dir):
    dataset = import_cranfield(cran_dir, oos_from_cacm=10)
    oos = [q for q in dataset.queries if q.scope == "oos"]
    cacm_text = (datasets_dir / "cacm" / "query.text").read_text().replace("\r", "")
    first_cacm = " ".join(cacm_text.split(".W", 1)[1].split(".N", 1)[0].split())
    assert len(dataset.queries) == 235 and len(oos) == 10
    assert [q.query_id for q in oos] == [f"cacm-{i}" for i in range(1, 11)]
    assert oos[0].query == first_cacm and oos[0].source == "cacm"
    assert not any(j.query_id.startswith("cacm-") for j in dataset.judgments)
    with pytest.raises(DataFormatError, match="--oos-from-cacm"):
        import_cranfield(cran_dir, oos_from_cacm=65)


def test_cli_writes_a_bundle_the_tuner_reads(cran_dir, tmp_path: Path):
    from tuner.data.dataset import load_queryset
    from tuner.data.qrels import read_qrels

    out = tmp_path / "cran"
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", "cranfield", "--src", str(cran_dir),
                           "--out", str(out), "--oos-from-cacm", "5"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "1400 documents, 230 queries (5 out of scope)" in proc.stdout
    assert f"next: tuner run {out / 'experiment.yaml'}" in proc.stdout
    # Output names carry the data set name, so the tuner's dataset id is "cranfield".
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "corpus.jsonl", "cranfield.qrels.txt", "cranfield.queries.jsonl", "experiment.yaml",
        "experiment_replay.yaml", "manifest.json", "space.yaml"]
    queries = load_queryset(out / "cranfield.queries.jsonl")
    assert queries.dataset_id == "cranfield"
    assert len(queries.in_scope()) == 225 and len(queries.oos()) == 5
    qrels = read_qrels(out / "cranfield.qrels.txt")
    assert sum(len(v) for v in qrels.values()) == sum(1 for _ in (out / "cranfield.qrels.txt").open())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 1400 and manifest["grade_mapping"]["codes"]["1"] == 3
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").open()]
    assert {"doc_id", "title", "text", "date"} <= corpus[0].keys()


def test_missing_file_is_one_line_naming_it(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", "cranfield", "--src", str(tmp_path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert f"{tmp_path / 'cran.all.1400'}" in proc.stderr and "fix:" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_qrels_line_names_file_and_line(tmp_path: Path):
    (tmp_path / "cran.all.1400").write_text(".I 1\n.T\nt\n.A\na\n.B\nb\n.W\nw\n")
    (tmp_path / "cran.qry").write_text(".I 001\n.W\nq\n")
    (tmp_path / "cranqrel").write_text("1 1 2\n1 x 2\n")
    with pytest.raises(DataFormatError, match=r"cranqrel:2: expected 'query_position doc_id code'"):
        import_cranfield(tmp_path)
    (tmp_path / "cranqrel").write_text("1 1 7\n")
    with pytest.raises(DataFormatError, match=r"cranqrel:1: relevance code 7 has no grade"):
        import_cranfield(tmp_path)
    (tmp_path / "cranqrel").write_text("2 1 1\n")
    with pytest.raises(DataFormatError, match=r"cranqrel:1: query number 2 is outside 1..1"):
        import_cranfield(tmp_path)
    (tmp_path / "cranqrel").write_text("1 1 1\n")
    written = write_dataset(import_cranfield(tmp_path), tmp_path / "bundle")
    assert sorted(p.name for p in written) == ["corpus.jsonl", "manifest.json", "qrels.txt", "queries.jsonl"]
    assert (tmp_path / "bundle" / "qrels.txt").read_text() == "1 0 1 3\n"
