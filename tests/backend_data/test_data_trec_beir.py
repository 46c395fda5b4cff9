"""TREC and BEIR importers on small collections written in tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fusion_backend.importers import import_beir, import_trec, parse_grade_map
from fusion_backend.importers.errors import DataFormatError
from fusion_backend.runs import read_run as service_read_run

TOPICS = """<top>
<num> Number: 301
<title> International Organized Crime

<desc> Description:
Identify organizations that participate in international criminal activity.

<narr> Narrative:
A relevant document must name the organization.
</top>

<top>
<num> Number: 302
<title> Poliomyelitis and Post-Polio
<desc> Description:
Is the disease of Poliomyelitis (polio) under control in the world?
</top>
"""

CLOSED_TOPICS = """<top><num>Number: 7</num><title>solar panels</title>
<desc>Description: efficiency of solar panels in winter</desc></top>"""

DOCS = """<DOC>
<DOCNO> FT911-1 </DOCNO>
<DATE>910514</DATE>
<HEADLINE>Crime ring broken</HEADLINE>
<TEXT>Police in three countries arrested members of an <B>international</B> gang.</TEXT>
</DOC>
<DOC>
<DOCNO>FT911-2</DOCNO>
<DATE>1991-05-15</DATE>
<TEXT>Vaccination campaigns against polio continue.</TEXT>
</DOC>
<DOC><DOCNO>FT911-3</DOCNO><TITLE>No date</TITLE><TEXT>Weather report.</TEXT></DOC>
"""

QRELS = "301 0 FT911-1 2\n301 0 FT911-3 0\n302 0 FT911-2 1\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trec_topics_qrels_docs(tmp_path: Path):
    dataset, extra = import_trec(_write(tmp_path, "topics", TOPICS), _write(tmp_path, "qrels", QRELS),
                                 docs=[_write(tmp_path, "docs.sgml", DOCS)])
    assert [(q.query_id, q.query) for q in dataset.queries] == [
        ("301", "International Organized Crime"), ("302", "Poliomyelitis and Post-Polio")]
    assert [(d.doc_id, d.title, d.date) for d in dataset.documents] == [
        ("FT911-1", "Crime ring broken", "1991-05-14"), ("FT911-2", "", "1991-05-15"),
        ("FT911-3", "No date", None)]
    assert dataset.documents[0].text == "Police in three countries arrested members of an international gang."
    # Codes 0..2: the top code means "answers the query" -> 3, lower codes keep their value.
    assert {(j.query_id, j.doc_id): j.grade for j in dataset.judgments} == {
        ("301", "FT911-1"): 3, ("301", "FT911-3"): 0, ("302", "FT911-2"): 1}
    assert dataset.manifest["grade_mapping"]["codes"] == {"0": 0, "1": 1, "2": 3}
    assert extra == {} and dataset.manifest["corpus_stub"] is False


@pytest.mark.parametrize(("field", "expected"), [
    ("desc", "Identify organizations that participate in international criminal activity."),
    ("title+desc", "International Organized Crime Identify organizations that participate in international "
                   "criminal activity."),
])
def test_trec_query_field(tmp_path: Path, field, expected):
    dataset, _ = import_trec(_write(tmp_path, "topics", TOPICS), _write(tmp_path, "qrels", QRELS), query_field=field)
    assert dataset.queries[0].query == expected
    assert dataset.queries[0].query_type == "long_tail"


def test_trec_closed_tags_and_tsv_topics(tmp_path: Path):
    dataset, _ = import_trec(_write(tmp_path, "t.xml", CLOSED_TOPICS), _write(tmp_path, "q", "7 0 d1 1\n"),
                             query_field="desc")
    assert [(q.query_id, q.query) for q in dataset.queries] == [("7", "efficiency of solar panels in winter")]
    dataset, _ = import_trec(_write(tmp_path, "t.tsv", "q1\tsolar panels\nq2\twind  turbines\n"),
                             _write(tmp_path, "q", "q1 0 d1 1\n"), unjudged="keep")
    assert [(q.query_id, q.query, q.query_type) for q in dataset.queries] == [
        ("q1", "solar panels", "short"), ("q2", "wind turbines", "short")]
    assert dataset.manifest["unjudged"] == {"policy": "keep", "count": 1, "examples": ["q2"]}
    # Binary qrels: 1 -> 3; no --docs: a stub corpus of the judged ids.
    assert [(j.doc_id, j.grade) for j in dataset.judgments] == [("d1", 3)]
    assert [(d.doc_id, d.text) for d in dataset.documents] == [("d1", "")]
    assert dataset.manifest["corpus_stub"] is True


def test_trec_grade_map_option_and_errors(tmp_path: Path):
    topics = _write(tmp_path, "topics", TOPICS)
    qrels = _write(tmp_path, "qrels", "301 0 a 4\n301 0 b 1\n")
    with pytest.raises(DataFormatError, match=r"relevance codes go up to 4.*--grade-map"):
        import_trec(topics, qrels)
    dataset, _ = import_trec(topics, qrels, grade_map=parse_grade_map("4:3,1:1"))
    assert [j.grade for j in dataset.judgments] == [3, 1]
    with pytest.raises(DataFormatError, match=r"qrels:1: relevance code 4 has no grade"):
        import_trec(topics, qrels, grade_map=parse_grade_map("1:1"))
    with pytest.raises(DataFormatError, match="CODE:GRADE"):
        parse_grade_map("4:5")
    _write(tmp_path, "dup", "301 0 a 1\n301 0 a 2\n")
    with pytest.raises(DataFormatError, match=r"dup:2: pair \(301, a\) already judged on line 1"):
        import_trec(topics, tmp_path / "dup")


def test_trec_runs_are_canonicalised_for_the_service(tmp_path: Path):
    run = "302 Q0 FT911-2 1 0.5 bm\n301 Q0 FT911-1 9 0.25 bm\n301 Q0 FT911-3 1 0.75 bm\n301 Q0 FT911-9 2 0.25 bm\n"
    dataset, extra = import_trec(_write(tmp_path, "topics", TOPICS), _write(tmp_path, "qrels", QRELS),
                                 runs=[f"splade={_write(tmp_path, 'splade.trec', run)}"])
    # Topic order, score descending, ties by docno descending (trec_eval's order), ranks renumbered.
    assert extra["runs/splade.run"].splitlines() == [
        "301 Q0 FT911-3 1 0.75 bm", "301 Q0 FT911-9 2 0.25 bm", "301 Q0 FT911-1 3 0.25 bm",
        "302 Q0 FT911-2 1 0.5 bm"]
    assert dataset.manifest["runs"] == {"splade": "runs/splade.run"}
    # The stub corpus holds every judged and every retrieved id, so the service can load the run.
    assert {d.doc_id for d in dataset.documents} == {"FT911-1", "FT911-2", "FT911-3", "FT911-9"}
    out = tmp_path / "bundle"
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", "trec",
                           "--topics", str(tmp_path / "topics"), "--qrels", str(tmp_path / "qrels"),
                           "--run", f"splade={tmp_path / 'splade.trec'}", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "next: tuner run" in proc.stdout
    assert (out / "trec.queries.jsonl").is_file() and (out / "trec.qrels.txt").is_file()
    corpus_ids = [json.loads(line)["doc_id"] for line in (out / "corpus.jsonl").open()]
    table = service_read_run(out / "runs" / "splade.run", {d: i for i, d in enumerate(corpus_ids)})
    assert table.dropped == 0


def test_trec_bad_run_line(tmp_path: Path):
    _write(tmp_path, "bad.run", "301 Q0 d1 1 0.5 x\n301 Q0 d1 2 0.4 x\n")
    with pytest.raises(DataFormatError, match=r"bad.run:2: document d1 listed twice for query 301"):
        import_trec(_write(tmp_path, "topics", TOPICS), _write(tmp_path, "qrels", QRELS),
                    runs=[str(tmp_path / "bad.run")])
    _write(tmp_path, "short.run", "301 Q0 d1 1 0.5\n")
    with pytest.raises(DataFormatError, match=r"short.run:1: expected 6 columns"):
        import_trec(_write(tmp_path, "topics", TOPICS), _write(tmp_path, "qrels", QRELS),
                    runs=[str(tmp_path / "short.run")])


def _beir(tmp_path: Path, test_qrels: str, dev_qrels: str) -> Path:
    root = tmp_path / "scifact"
    (root / "qrels").mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "Vitamin D", "text": "Vitamin D and bone density.", "metadata": {"date": "2019-03-02"}},
        {"_id": "d2", "title": "", "text": "Sleep and memory.", "metadata": {"journal": "Nature"}},
        {"_id": "d3", "title": "Coffee", "text": "Coffee and heart rate."},
    ]
    queries = [{"_id": "q1", "text": "does vitamin d help bones"}, {"_id": "q2", "text": "sleep memory"},
               {"_id": "q3", "text": "unjudged question"}]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + test_qrels)
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + dev_qrels)
    return root


def test_beir_layout(tmp_path: Path):
    root = _beir(tmp_path, "q1\td1\t1\nq1\td3\t0\n", "q2\td2\t1\n")
    dataset = import_beir(root)
    assert [(q.query_id, q.split, q.source) for q in dataset.queries] == [("q1", "test", "scifact"),
                                                                          ("q2", "dev", "scifact")]
    assert {(j.query_id, j.doc_id): j.grade for j in dataset.judgments} == {
        ("q1", "d1"): 3, ("q1", "d3"): 0, ("q2", "d2"): 3}
    assert [(d.doc_id, d.date) for d in dataset.documents] == [("d1", "2019-03-02"), ("d2", None), ("d3", None)]
    assert dataset.documents[1].attributes == {"metadata": {"journal": "Nature"}}
    only_dev = import_beir(root, splits=["dev"])
    assert [q.query_id for q in only_dev.queries] == ["q2"]
    with pytest.raises(DataFormatError, match=r"split\(s\) \['train'\] not found"):
        import_beir(root, splits=["train"])


def test_beir_errors_name_file_and_line(tmp_path: Path):
    root = _beir(tmp_path, "q1\td1\t1\n", "q1\td2\t1\n")
    with pytest.raises(DataFormatError, match=r"test.tsv:2: query q1 is also in split 'dev'"):
        import_beir(root)
    with open(root / "corpus.jsonl", "a") as fh:
        fh.write("{not json\n")
    with pytest.raises(DataFormatError, match=r"corpus.jsonl:4: invalid JSON"):
        import_beir(root, splits=["test"])


def test_beir_cli_round_trip(tmp_path: Path):
    from tuner.data.dataset import load_queryset

    root = _beir(tmp_path, "q1\td1\t2\nq1\td3\t1\n", "q2\td2\t1\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", "beir", "--src", str(root),
                           "--splits", "test", "--grade-map", "2:3,1:1", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "scifact.qrels.txt").read_text() == "q1 0 d1 3\nq1 0 d3 1\n"
    assert load_queryset(out / "scifact.queries.jsonl").queries[0].split == "test"
    assert {"config.yaml", "space.yaml", "experiment.yaml"} <= {p.name for p in out.iterdir()}


def test_beir_reimport_stops_on_an_applied_config_and_keeps_tuner_state(tmp_path: Path):
    """Every importer shares the re-import check: the real command, a config `tuner apply` changed."""
    root = _beir(tmp_path, "q1\td1\t2\nq1\td3\t1\n", "q2\td2\t1\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fusion_backend.importers", "beir", "--src", str(root), "--out", str(out)]
    assert subprocess.run(command, capture_output=True, text=True).returncode == 0
    (out / ".tuner").mkdir()
    (out / ".tuner" / "optuna.db").write_bytes(b"study")
    config = (out / "config.yaml").read_text().replace("rrf_k: 60 ", "rrf_k: 167")
    (out / "config.yaml").write_text(config)
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {out / 'config.yaml'}: edited since the last import; overwriting it "
                                  "would change fusion.rrf_k 167 -> 60; nothing was written; fix: pass --force")
    assert (out / "config.yaml").read_text() == config
    proc = subprocess.run([*command, "--force"], capture_output=True, text=True)
    assert proc.returncode == 0 and "overwrote the edited config.yaml (--force)" in proc.stdout, proc.stderr
    assert "rrf_k: 60 " in (out / "config.yaml").read_text()
    assert [p.read_text() for p in (out / ".import-backups").glob("*/config.yaml")] == [config]
    assert (out / ".tuner" / "optuna.db").read_bytes() == b"study"
