"""The ``files`` importer on small inputs: every format, every kind of bad input, a
re-import over an edited bundle, the unjudged policy, and the ready config / space /
experiment served and loaded for real.

Real-data tests (Cranfield through ``files``, a real study on the result, full-precision
runs) are in test_data_files_cranfield.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fusion_backend.config import load_config
from fusion_backend.importers import import_files, import_trec
from fusion_backend.importers.__main__ import main
from fusion_backend.importers.errors import DataFormatError
from fusion_backend.importers.ready import plan_sources
from fusion_backend.importers.runfiles import RunLine, read_run, render_run
from support.backend import start_backend

CORPUS = [
    {"doc_id": "d1", "title": "Wing flutter", "text": "flutter of swept wings at transonic speed", "date": "1958-01-01"},
    {"_id": "d2", "title": "Heat transfer", "text": "heat transfer in a laminar boundary layer",
     "metadata": {"date": "1961-05-02", "journal": "jas"}},
    {"id": "d3", "contents": "buckling of thin cylindrical shells", "pages": 12},
    {"doc_id": "d4", "title": "", "text": "shock wave and boundary layer interaction"},
]
QUERIES = [{"query_id": "q1", "query": "wing flutter"}, {"_id": "q2", "text": "boundary  layer heat transfer"},
           {"qid": "q3", "query": "shell buckling", "date_hint_days": 30, "metadata": {"x": 1}}]
QRELS = "q1 0 d1 2\nq1 0 d4 0\nq2 0 d2 2\nq2 0 d4 1\nq3 0 d3 2\n"
RUN_A = "q1 Q0 d1 1 12.5 a\nq1 Q0 d4 2 3.25 a\nq2 Q0 d2 1 9.0 a\nq3 Q0 d3 1 7.0 a\n"
RUN_B = [{"query_id": "q1", "results": [{"doc_id": "d1", "score": 0.91}, {"doc_id": "d2", "score": 0.4}]},
         {"query_id": "q2", "results": [{"doc_id": "d4", "score": 0.8}, {"doc_id": "d2", "score": 0.75}]}]


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def write_inputs(root: Path, **override: str) -> dict[str, Path]:
    """A small valid input set; ``override`` replaces one file's text (by file name)."""
    texts = {"corpus.jsonl": _jsonl(CORPUS), "queries.jsonl": _jsonl(QUERIES), "qrels.txt": QRELS,
             "a.run": RUN_A, "b.jsonl": _jsonl(RUN_B), **override}
    root.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (root / name).write_text(text)
    return {name: root / name for name in texts}


def argv(paths: dict[str, Path], out: Path, *extra: str, corpus: str = "corpus.jsonl",
         queries: str = "queries.jsonl", qrels: str = "qrels.txt") -> list[str]:
    return ["files", "--name", "mini", "--corpus", str(paths[corpus]), "--queries", str(paths[queries]),
            "--qrels", str(paths[qrels]), "--run", f"lex={paths['a.run']}", "--run", f"sem={paths['b.jsonl']}",
            "--out", str(out), *extra]


# --- formats ---------------------------------------------------------------------------

def test_jsonl_inputs_with_beir_and_pyserini_keys(tmp_path: Path):
    paths = write_inputs(tmp_path)
    dataset, extra = import_files("mini", paths["corpus.jsonl"], paths["queries.jsonl"], paths["qrels.txt"],
                                  runs=[f"lex={paths['a.run']}", f"sem={paths['b.jsonl']}"])
    docs = {d.doc_id: d for d in dataset.documents}
    assert [(d.doc_id, d.title, d.date) for d in dataset.documents] == [
        ("d1", "Wing flutter", "1958-01-01"), ("d2", "Heat transfer", "1961-05-02"), ("d3", "", None),
        ("d4", "", None)]
    assert docs["d3"].text == "buckling of thin cylindrical shells" and docs["d3"].attributes == {"pages": 12}
    assert docs["d2"].attributes == {"metadata": {"journal": "jas"}}  # the date moved out of metadata
    # Scalar extras stay request fields; BEIR metadata would be sent with every request: left out.
    assert [(q.query_id, q.query, q.source, q.scope, dict(q.extra)) for q in dataset.queries] == [
        ("q1", "wing flutter", "mini", "in", {}), ("q2", "boundary layer heat transfer", "mini", "in", {}),
        ("q3", "shell buckling", "mini", "in", {"date_hint_days": 30})]
    assert {(j.query_id, j.doc_id): j.grade for j in dataset.judgments}[("q2", "d4")] == 1
    assert dataset.manifest["runs"] == {"lex": "runs/lex.run", "sem": "runs/sem.run"}
    assert extra["runs/sem.run"].splitlines() == [
        "q1 Q0 d1 1 0.91 sem", "q1 Q0 d2 2 0.4 sem", "q2 Q0 d4 1 0.8 sem", "q2 Q0 d2 2 0.75 sem"]


def test_tsv_corpus_tsv_queries_and_qrels_forms(tmp_path: Path):
    paths = write_inputs(tmp_path, **{
        "corpus.tsv": "d1\tWing flutter\tflutter of swept wings\nd2\theat transfer text\n",
        "header.tsv": "id\ttext\ttitle\nd1\tflutter of swept wings\tWing flutter\nd2\tbuckling\t\n",
        "queries.tsv": "q1\twing flutter\nq2\theat\n",
        "beir.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n",
        "three.txt": "q1 d1 1\nq2 d2 1\n",
        "qrels.jsonl": _jsonl([{"query_id": "q1", "doc_id": "d1", "relevance": 1},
                               {"qid": "q2", "docid": "d2", "score": 1}]),
    })
    for corpus in ("corpus.tsv", "header.tsv"):
        for qrels in ("beir.tsv", "three.txt", "qrels.jsonl"):
            dataset, _ = import_files("mini", paths[corpus], paths["queries.tsv"], paths[qrels])
            assert [(d.doc_id, d.title) for d in dataset.documents][0] == ("d1", "Wing flutter")
            assert [q.query_id for q in dataset.queries] == ["q1", "q2"]
            # Binary codes: auto maps the top code 1 to grade 3.
            assert [(j.query_id, j.doc_id, j.grade) for j in dataset.judgments] == [("q1", "d1", 3), ("q2", "d2", 3)]


def test_trec_topics_as_queries(tmp_path: Path):
    topics = "<top>\n<num> Number: q1\n<title> wing flutter\n<desc> Description:\nflutter of wings\n</top>\n"
    paths = write_inputs(tmp_path, topics=topics, **{"q.txt": "q1 0 d1 1\n"})
    dataset, _ = import_files("mini", paths["corpus.jsonl"], paths["topics"], paths["q.txt"], query_field="desc")
    assert [(q.query_id, q.query) for q in dataset.queries] == [("q1", "flutter of wings")]


def test_the_three_run_forms_give_the_same_canonical_run(tmp_path: Path):
    trec = "q1 Q0 d1 1 0.5 x\nq1 Q0 d2 2 0.25 x\nq2 Q0 d3 1 1.0 x\n"
    jsonl = _jsonl([{"query_id": "q1", "results": [{"doc_id": "d2", "score": 0.25}, {"doc_id": "d1", "score": 0.5}]},
                    {"query_id": "q2", "results": [{"doc_id": "d3", "score": 1.0}]}])
    array = json.dumps([{"query": {"qid": "q1", "text": "t"}, "hits": [
        {"qid": "q1", "docid": "d1", "rank": 1, "score": 0.5, "doc": "..."},
        {"docid": "d2", "rank": 2, "score": 0.25}]}, {"qid": "q2", "hits": [{"docid": "d3", "score": 1.0}]}])
    texts = []
    for name, text in (("t.run", trec), ("j.jsonl", jsonl), ("a.json", array)):
        (tmp_path / name).write_text(text)
        texts.append(render_run(read_run(tmp_path / name, "x"), ["q1", "q2"]))
    assert texts[0] == texts[1] == texts[2] == "q1 Q0 d1 1 0.5 x\nq1 Q0 d2 2 0.25 x\nq2 Q0 d3 1 1.0 x\n"


def test_run_scores_round_trip_exactly():
    # Scores that differ only in the 9th+ significant digit: the old .6g made them ties.
    scores = [0.123456789, 0.123456788, 0.1234567871, 2.0000000000000004, 2.0, 1e-12, 12345678.901234]
    assert len({f"{s:.6g}" for s in scores}) == 4
    text = render_run([RunLine("q1", f"d{i}", s, "t") for i, s in enumerate(scores)], ["q1"])
    parsed = [(line.split()[2], float(line.split()[4])) for line in text.splitlines()]
    assert parsed == sorted(((f"d{i}", s) for i, s in enumerate(scores)), key=lambda p: -p[1])


# --- bad input: one line, exit 2, nothing written ----------------------------------------

BAD_INPUTS = [
    ({"corpus.jsonl": '{"doc_id": "d1", "text": "x"}\n{oops\n'}, {}, r"corpus.jsonl:2: invalid JSON"),
    ({"corpus.jsonl": '{"title": "no id"}\n'}, {}, r"corpus.jsonl:1: record has no 'doc_id'"),
    ({"corpus.jsonl": _jsonl(CORPUS + [{"doc_id": "d1", "text": "again"}])}, {},
     r"corpus.jsonl:5: doc_id 'd1' already used on line 1"),
    ({"c.tsv": "d1\tx\nd2\ta\tb\tc\n"}, {"corpus": "c.tsv"}, r"c.tsv:2: expected 'doc_id<TAB>text'"),
    ({"queries.jsonl": '{"query_id": "q1"}\n'}, {}, r"queries.jsonl:1: record needs a 'query_id'"),
    ({"queries.jsonl": _jsonl(QUERIES + [QUERIES[0]])}, {}, r"queries.jsonl:4: query_id 'q1' already used on line 1"),
    ({"q.tsv": "q1 no tab here\n"}, {"queries": "q.tsv"}, r"q.tsv:1: expected 'qid<TAB>query text'"),
    ({"qrels.txt": "q1 0 d1 1 extra\n"}, {}, r"qrels.txt:1: expected 3 or 4 columns"),
    ({"qrels.txt": "q1 0 d1 1\nq2 d2 1\n"}, {}, r"qrels.txt:2: expected 4 columns"),
    ({"qrels.txt": "q1 0 d1 1\nq2 0 d2 high\n"}, {}, r"qrels.txt:2: relevance 'high' is not an integer"),
    ({"qrels.txt": "q1 0 d1 1\nq1 0 d1 2\n"}, {}, r"qrels.txt:2: pair \(q1, d1\) already judged on line 1"),
    ({"qrels.txt": '{"query_id": "q1", "doc_id": "d1"}\n'}, {}, r"qrels.txt:1: record needs a query_id, a doc_id"),
    ({"qrels.txt": "q1 0 d1 7\n"}, {}, r"qrels.txt: relevance codes go up to 7, above grade 3; fix: pass --grade-map"),
    ({"qrels.txt": ""}, {}, r"qrels.txt: no judgments"),
    ({"qrels.txt": "Q1 0 D1 1\n"}, {}, r"qrels.txt: none of its 1 judged query ids is in --queries \(its: 'Q1'; "
                                       r"--queries: 'q1', 'q2', 'q3'\)"),
    ({"qrels.txt": "q1 0 D1 1\n"}, {}, r"qrels.txt: none of its 1 judged doc ids is in the corpus \(its: 'D1'"),
    ({"a.run": "q1 Q0 d1 1 0.5\n"}, {}, r"a.run:1: expected 6 columns 'qid Q0 docno rank score tag'"),
    ({"a.run": "q1 Q0 d1 1 nan x\n"}, {}, r"a.run:1: score 'nan' is not a finite number"),
    ({"a.run": "q1 Q0 d1 1 0.5 x\nq1 Q0 d1 2 0.4 x\n"}, {}, r"a.run:2: document d1 listed twice for query q1"),
    ({"a.run": "Q1 Q0 d1 1 0.5 x\n"}, {}, r"a.run: none of its 1 query ids is in --queries"),
    ({"a.run": "q1 Q0 doc-1 1 0.5 x\n"}, {}, r"a.run: none of its 1 doc ids is in the corpus \(its: 'doc-1'"),
    ({"b.jsonl": '{"query_id": "q1", "hits": []}\n'}, {}, r"b.jsonl:1: record has no 'results' list"),
    ({"b.jsonl": '{"query_id": "q1", "results": [{"doc_id": "d1"}]}\n'}, {}, r"b.jsonl:1: query q1: result d1 has "
                                                                             r"no 'score'"),
    ({"b.jsonl": '[{"qid": "q1", "hits": [{"score": 1.0}]}]'}, {}, r"b.jsonl: query q1: no 'doc_id' or 'docid'"),
    ({"b.jsonl": '[{"qid": "q1", "hits": [}]'}, {}, r"b.jsonl:1: invalid JSON"),
    ({"b.jsonl": '[{"qid": "q1"}]'}, {}, r"b.jsonl: query object 1 has no 'hits' list"),
]


@pytest.mark.parametrize(("override", "names", "message"), BAD_INPUTS,
                         ids=[f"{i}-{m.split(':')[0].split(' ')[0]}" for i, (_, _, m) in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_with_the_fix(tmp_path: Path, capsys, override, names, message):
    paths = write_inputs(tmp_path / "in", **override)
    out = tmp_path / "out"
    assert main(argv(paths, out, **names)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "; fix: " in err, err
    assert re.search(message, err), err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(("extra", "message"), [
    (("--run", "9lives=x.run"), r"--run: run name '9lives' is not \[A-Za-z\]"),
    (("--run", "lex=also.run"), r"--run: run name 'lex' given twice"),
    (("--oos", "OOS"), r"out-of-scope query ids are also in --queries, e.g. 'q1'"),
    (("--unjudged", "error"), r"qrels.txt: 1 in-scope queries have no judgment at all, e.g. 'q4'; fix: judge them"),
])
def test_bad_options_are_one_line(tmp_path: Path, capsys, extra, message):
    paths = write_inputs(tmp_path, **{"queries.jsonl": _jsonl(QUERIES + [{"query_id": "q4", "query": "x"}])})
    extra = tuple(str(paths["queries.jsonl"]) if e == "OOS" else e for e in extra)
    assert main(argv(paths, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_bad_name_and_missing_file_through_the_real_command(tmp_path: Path):
    paths = write_inputs(tmp_path)
    for args, message in ((["--name", "my data"], "--name: data set name 'my data' is not"),
                          (["--corpus", str(tmp_path / "nope.jsonl")], "nope.jsonl: file not found")):
        full = argv(paths, tmp_path / "out")
        full[full.index(args[0]) + 1] = args[1]
        proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", *full],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
        assert proc.stdout == "" and not (tmp_path / "out").exists()


def test_failed_import_leaves_an_existing_bundle_untouched(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "in" / "b.jsonl").write_text('{"query_id": "q1", "results": [{"doc_id": "d1", "score": "x"}]}\n')
    assert main(argv(paths, out)) == 2
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


# --- re-import over a bundle: edited ready files, the data, .tuner/ and mlruns/ -----------

def _plant_state(out: Path) -> dict[str, tuple[bytes, int]]:
    """A study's state in the bundle (.tuner/: study, labels, journal; mlruns/): bytes and mtime."""
    for rel in (".tuner/optuna.db", ".tuner/labels.db", ".tuner/journal/config.yaml.json", "mlruns/0/meta.yaml"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(f"state of {rel}\n")
    return _state(out)


def _state(out: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns)
            for top in (".tuner", "mlruns") for p in (out / top).rglob("*") if p.is_file()}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _apply_by_hand(config: Path) -> bytes:
    """What `tuner apply` leaves: config.yaml with other values (the survey's rrf_k 167, threshold 0.34)."""
    text = config.read_text()
    edited = text.replace("rrf_k: 60 ", "rrf_k: 167").replace("threshold: 0.0", "threshold: 0.34")
    assert edited != text
    config.write_text(edited)
    return edited.encode()


def test_reimport_refuses_to_overwrite_an_edited_config(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    state = _plant_state(out)
    _apply_by_hand(out / "config.yaml")
    before = _files(out)
    capsys.readouterr()
    assert main(argv(paths, out)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err == (
        f"error: {out / 'config.yaml'}: edited since the last import; overwriting it would change fusion.rrf_k "
        f"167 -> 60, confidence.threshold 0.34 -> 0.0; nothing was written; fix: pass --force to overwrite it "
        f"(the edited file is first copied to {out / '.import-backups'}/<UTC time>/), or import into another --out\n")
    assert _files(out) == before  # the config and everything else as it was
    assert _state(out) == state and not (out / ".import-backups").exists()


@pytest.mark.parametrize("name", ["space.yaml", "experiment.yaml", "experiment_replay.yaml"])
def test_reimport_refuses_to_overwrite_every_edited_ready_file(tmp_path: Path, capsys, name: str):
    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    state = _plant_state(out)
    text = (out / name).read_text()
    (out / name).write_text(text.replace("n_trials: 30", "n_trials: 80").replace("high: 200", "high: 400"))
    with open(out / "config.yaml", "a") as fh:  # a comment only: still an edit, said so
        fh.write("# reviewed by ops\n")
    before = _files(out)
    assert main(argv(paths, out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out / 'config.yaml'}, {out / name}: edited since the last import; "
                          "overwriting them would change in config.yaml comments or layout only (no value differs); "
                          f"in {name} "), err
    assert ("fusion.rrf_k.high 400 -> 200" if name == "space.yaml" else "n_trials 80 -> 30") in err
    assert "fix: pass --force to overwrite them (the edited files are first copied to" in err
    assert _files(out) == before and _state(out) == state


def test_force_backs_up_the_edited_config_then_overwrites_it(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path / "in")
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert main(argv(paths, out)) == 0 and main(argv(paths, fresh)) == 0
    state = _plant_state(out)
    edited = _apply_by_hand(out / "config.yaml")
    capsys.readouterr()
    assert main(argv(paths, out, "--force")) == 0
    printed = capsys.readouterr().out
    backups = list((out / ".import-backups").iterdir())
    assert len(backups) == 1 and re.fullmatch(r"\d{8}T\d{6}Z", backups[0].name)
    assert sorted(p.name for p in backups[0].iterdir()) == ["config.yaml"]
    assert (backups[0] / "config.yaml").read_bytes() == edited
    assert f"overwrote the edited config.yaml (--force); the edited version is kept in {backups[0]}/\n" in printed
    assert (out / "config.yaml").read_bytes() == (fresh / "config.yaml").read_bytes()
    assert _state(out) == state
    # The record now holds the overwritten file: the next import is quiet and makes no backup.
    assert main(argv(paths, out)) == 0
    assert "overwrote" not in capsys.readouterr().out and len(list((out / ".import-backups").iterdir())) == 1
    assert _state(out) == state


def test_unedited_reimport_rewrites_the_bundle_quietly(tmp_path: Path, capsys):
    """The data and the unedited ready files are the importer's own: rewritten without a word,
    also when the new import writes other ready files (here --with-lexical's sources)."""
    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    state = _plant_state(out)
    (out / "corpus.jsonl").write_text("edited by hand\n")  # a data file: the importer's, rewritten
    paths["qrels.txt"].write_text(QRELS.replace("q3 0 d3 2", "q3 0 d3 1"))
    capsys.readouterr()
    assert main(argv(paths, out, "--with-lexical")) == 0
    printed = capsys.readouterr().out
    assert "overwrote" not in printed and printed.startswith("mini: 4 documents")
    assert "bm25" in (out / "config.yaml").read_text() and "q3 0 d3 1" in (out / "mini.qrels.txt").read_text()
    assert (out / "corpus.jsonl").read_text().startswith('{"doc_id": "d1"')
    assert _state(out) == state and not (out / ".import-backups").exists()
    # A file already holding what the import writes is no edit either.
    config = (out / "config.yaml").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["ready_files_sha256"]["config.yaml"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(argv(paths, out, "--with-lexical")) == 0
    assert (out / "config.yaml").read_text() == config and _state(out) == state


def test_a_ready_file_no_import_recorded_is_not_overwritten(tmp_path: Path, capsys):
    """A bundle from before the record, or an --out holding someone's own config.yaml."""
    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["ready_files_sha256"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    _apply_by_hand(out / "config.yaml")
    assert main(argv(paths, out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out / 'config.yaml'}: not recorded as the importer's (manifest.json holds no "
                          "sha256 of config.yaml: an import older than that record, or a file the importer did not "
                          "write); overwriting it would change fusion.rrf_k 167 -> 60"), err
    manifest["ready_files_sha256"] = {"space.yaml": "0" * 64}  # one file recorded (and edited), one not
    (out / "manifest.json").write_text(json.dumps(manifest))
    with open(out / "space.yaml", "a") as fh:
        fh.write("# narrowed by hand\n")
    assert main(argv(paths, out)) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {out / 'config.yaml'}, {out / 'space.yaml'}: edited since the last import, or not recorded as the "
        "importer's (manifest.json holds no sha256 of config.yaml: ")
    theirs = tmp_path / "project"
    theirs.mkdir()
    (theirs / "config.yaml").write_text("fusion: {method: linear}\n")
    assert main(argv(paths, theirs)) == 2
    assert "fusion.method linear -> rrf" in capsys.readouterr().err
    assert [p.name for p in theirs.iterdir()] == ["config.yaml"]


# --- the unjudged policy ----------------------------------------------------------------

def test_unjudged_in_scope_queries_are_dropped_and_counted(tmp_path: Path, capsys):
    extra_queries = [{"query_id": f"u{i}", "query": f"unjudged {i}"} for i in range(3)]
    oos = [{"query_id": "o1", "query": "where is my parcel"}]
    paths = write_inputs(tmp_path, **{"queries.jsonl": _jsonl(QUERIES + extra_queries), "oos.jsonl": _jsonl(oos)})
    assert main(argv(paths, tmp_path / "out", "--oos", str(paths["oos.jsonl"]))) == 0
    stdout = capsys.readouterr().out
    assert "mini: 4 documents, 4 queries (1 out of scope)" in stdout
    assert "dropped 3 in-scope queries without any judgment" in stdout and "--unjudged keep" in stdout
    written = [json.loads(line) for line in (tmp_path / "out" / "mini.queries.jsonl").open()]
    # Out-of-scope queries are never judged and never dropped.
    assert [(q["query_id"], q["scope"], q["query_type"], q["source"]) for q in written] == [
        ("q1", "in", "short", "mini"), ("q2", "in", "short", "mini"), ("q3", "in", "short", "mini"),
        ("o1", "oos", "off_topic", "oos")]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unjudged"] == {"policy": "drop", "count": 3, "examples": ["u0", "u1", "u2"]}
    assert main(argv(paths, tmp_path / "kept", "--unjudged", "keep")) == 0
    assert "kept 3 in-scope queries without any judgment" in capsys.readouterr().out
    assert sum(1 for _ in (tmp_path / "kept" / "mini.queries.jsonl").open()) == 6


def test_judgments_of_queries_outside_the_query_file_are_left_out(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path, **{"qrels.txt": QRELS + "q99 0 d1 1\nq98 0 d2 1\n"})
    assert main(argv(paths, tmp_path / "out")) == 0
    assert "left out 2 judgments of queries that are not in --queries" in capsys.readouterr().out
    assert "q99" not in (tmp_path / "out" / "mini.qrels.txt").read_text()


# --- the ready bundle ----------------------------------------------------------------------

def test_ready_bundle_names_layout_and_loads_in_both_packages(tmp_path: Path, capsys):
    from tuner.config.experiment import load_experiment
    from tuner.config.space.loading import load_space

    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    printed = capsys.readouterr().out
    assert f"next: tuner run {out / 'experiment.yaml'}" in printed
    assert f"  or, the fusion params replayed (one trial searches their grid): tuner run " \
           f"{out / 'experiment_replay.yaml'}" in printed
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "config.yaml", "corpus.jsonl", "experiment.yaml", "experiment_replay.yaml", "manifest.json",
        "mini.qrels.txt", "mini.queries.jsonl", "runs/lex.run", "runs/sem.run", "space.yaml"]
    cfg = load_config(out / "config.yaml")
    assert cfg.data.corpus == out / "corpus.jsonl" and cfg.data.runs == {"lex": out / "runs/lex.run",
                                                                          "sem": out / "runs/sem.run"}
    assert {n: (s.type, s.enabled) for n, s in cfg.sources.items()} == {
        "lex": ("run", True), "sem": ("run", True), "dense": ("dense", False)}
    assert cfg.fusion.weights == {"lex": 1.0, "sem": 1.0}
    assert cfg.confidence.threshold == 0.0 and cfg.citation.min_score == 0.0
    exp = load_experiment(out / "experiment.yaml")
    assert exp.dataset.queries == out / "mini.queries.jsonl" and exp.dataset.dataset_id == "mini"
    assert [lab.path for lab in exp.dataset.labels] == [out / "mini.qrels.txt"]
    assert exp.constraints == [] and exp.n_trials == 30 and exp.tracking.enabled
    assert exp.evaluation.request.body["query_id"] == "{query_id}" and exp.target.port == "auto"
    assert exp.target.config_files == [out / "config.yaml"] and exp.state_dir == out / ".tuner"
    space = load_space(exp.search_space, exp.target.config_files)
    text = (out / "space.yaml").read_text()
    assert "components: [lex, sem]" in text and text.count("post_retrieval: true") == 2 and space
    # the fastest path is the default one: trials reload the backend instead of restarting it
    assert exp.target.reload is not None and exp.target.reload.http is not None
    assert exp.target.reload.http.url == "http://127.0.0.1:{port}/admin/reload"
    assert exp.target.reload.fingerprint == "config_fingerprint" and "data" in exp.target.reload.restart_keys
    assert exp.replay is None
    # and the replay variant beside it: the same study set-up with the fusion params replayed
    replay = load_experiment(out / "experiment_replay.yaml")
    assert replay.study == "mini-replay" and replay.replay is not None and replay.target.reload is not None
    assert replay.replay.params == {"fusion.method": "method", "fusion.rrf_k": "rrf_k", "fusion.weights": "weights",
                                    "fusion.normalization": "normalization"}
    assert replay.search_space == exp.search_space and replay.dataset == exp.dataset


def test_the_bundle_moves_as_a_whole(tmp_path: Path):
    from tuner.config.experiment import load_experiment

    paths = write_inputs(tmp_path / "in")
    assert main(argv(paths, tmp_path / "a")) == 0
    (tmp_path / "a").rename(tmp_path / "b")
    exp = load_experiment(tmp_path / "b" / "experiment.yaml")
    assert exp.dataset.queries == tmp_path / "b" / "mini.queries.jsonl"
    assert load_config(tmp_path / "b" / "config.yaml").data.runs["lex"] == tmp_path / "b" / "runs" / "lex.run"


def test_oos_queries_bring_the_oos_constraint(tmp_path: Path):
    from tuner.config.experiment import load_experiment

    paths = write_inputs(tmp_path, **{"oos.jsonl": _jsonl([{"query_id": "o1", "query": "reset my password"}])})
    assert main(argv(paths, tmp_path / "out", "--oos", str(paths["oos.jsonl"]))) == 0
    exp = load_experiment(tmp_path / "out" / "experiment.yaml")
    assert [c.name for c in exp.constraints] == ["OOS_FP_Rate <= 0.1"]


@pytest.mark.parametrize(("runs", "lexical", "expected"), [
    ({}, False, {"bm25": True, "dense": True}),
    ({"splade": "r"}, False, {"splade": True, "dense": False}),
    ({"splade": "r"}, True, {"splade": True, "bm25": True, "dense": True}),
    # Runs named like the built-in sources keep their names; the built-ins step aside.
    ({"bm25": "r", "dense": "r"}, True, {"bm25": True, "dense": True, "bm25_local": True, "dense_local": True}),
    ({"bm25": "r", "dense": "r"}, False, {"bm25": True, "dense": True, "dense_local": False}),
])
def test_source_plan(runs, lexical, expected):
    plan = plan_sources(runs, with_lexical=lexical, has_text=True)
    names = {**{n: True for n in plan.runs}, **({plan.bm25: True} if plan.bm25 else {}), plan.dense: plan.dense_enabled}
    assert names == expected


def test_with_lexical_serves_bm25_and_dense_next_to_the_runs(tmp_path: Path):
    from tuner.config.space.loading import load_space

    paths = write_inputs(tmp_path / "in")
    assert main(argv(paths, tmp_path / "out", "--with-lexical")) == 0
    cfg = load_config(tmp_path / "out" / "config.yaml")
    assert cfg.fusion.weights == {"lex": 1.0, "sem": 1.0, "bm25": 1.0, "dense": 1.0}
    assert load_space(tmp_path / "out" / "space.yaml", [tmp_path / "out" / "config.yaml"])
    assert "components: [lex, sem, bm25, dense]" in (tmp_path / "out" / "space.yaml").read_text()


def test_ready_config_serves_the_runs_by_query_id(tmp_path: Path):
    paths = write_inputs(tmp_path / "in")
    assert main(argv(paths, tmp_path / "out")) == 0
    with start_backend(tmp_path / "out" / "config.yaml") as backend:
        body = backend.search({"query": "anything", "query_id": "q1", "top_k": 10}).json()
        # RRF of lex (d1, d4) and sem (d1, d2): d4 and d2 tie at 1/62, ties keep corpus order.
        assert [r["doc_id"] for r in body["results"]] == ["d1", "d2", "d4"]
        assert body["handoff"] is False and body["handoff_reason"] is None
        forgot = backend.search({"query": "anything", "top_k": 10}).json()
        assert forgot["handoff"] is True and "need the request's query_id" in forgot["handoff_reason"]


def test_trec_runs_without_documents_are_served(tmp_path: Path, capsys):
    """A stub corpus (no --docs) has no term at all: the dense space is all zeros, runs still fuse."""
    (tmp_path / "topics.tsv").write_text("301\tcrime\n302\tpolio\n303\tunjudged topic\n")
    (tmp_path / "qrels").write_text("301 0 FT-1 1\n302 0 FT-2 1\n")
    (tmp_path / "r.run").write_text("301 Q0 FT-1 1 2.5 r\n301 Q0 FT-3 2 1.5 r\n302 Q0 FT-2 1 1.0 r\n")
    base = ["trec", "--topics", str(tmp_path / "topics.tsv"), "--qrels", str(tmp_path / "qrels"),
            "--run", f"r={tmp_path / 'r.run'}", "--name", "mini"]
    assert main([*base, "--out", str(tmp_path / "out")]) == 0
    assert "dropped 1 in-scope queries without any judgment" in capsys.readouterr().out
    assert "confidence.threshold" not in (tmp_path / "out" / "space.yaml").read_text()  # nothing to gate on
    with start_backend(tmp_path / "out" / "config.yaml") as backend:
        body = backend.search({"query": "crime", "query_id": "301"}).json()
        assert [r["doc_id"] for r in body["results"]] == ["FT-1", "FT-3"] and body["confidence"] == 0.0
    assert main([*base, "--with-lexical", "--out", str(tmp_path / "lex")]) == 2
    assert "--with-lexical: bm25 and dense need document text" in capsys.readouterr().err


def test_trec_topics_without_judgments_are_dropped_by_default(tmp_path: Path):
    (tmp_path / "topics.tsv").write_text("".join(f"{i}\ttopic {i}\n" for i in range(1, 11)))
    (tmp_path / "qrels").write_text("1 0 d1 1\n2 0 d2 0\n")  # a grade-0 judgment still counts as judged
    dataset, _ = import_trec(tmp_path / "topics.tsv", tmp_path / "qrels")
    assert [q.query_id for q in dataset.queries] == ["1", "2"]
    assert dataset.manifest["unjudged"]["count"] == 8
    with pytest.raises(DataFormatError, match="8 in-scope queries have no judgment at all, e.g. '3'"):
        import_trec(tmp_path / "topics.tsv", tmp_path / "qrels", unjudged="error")


# --- out-of-scope queries: every query format, and the ones no source ranks (issue 26) -------

OOS_SMART = ".I 901\n.W\n what articles deal with time sharing\n systems?\n.N\n 1. Richard Alexander\n" \
            ".I 902\n.W\nparallel sorting networks\n"


@pytest.mark.parametrize(("name", "text"), [
    ("oos.qry", OOS_SMART),
    ("oos.tsv", "901\twhat articles deal with time sharing systems?\n902\tparallel sorting networks\n"),
    ("oos.topics", "<top>\n<num> Number: 901\n<title> what articles deal with time sharing systems?\n</top>\n"
                   "<top>\n<num> Number: 902\n<title> parallel sorting networks\n</top>\n"),
    ("oos.jsonl", _jsonl([{"query_id": "901", "query": "what articles deal with time sharing systems?"},
                          {"query_id": "902", "query": "parallel sorting networks"}])),
])
def test_oos_reads_every_query_format(tmp_path: Path, name: str, text: str):
    paths = write_inputs(tmp_path / "in", **{name: text})
    assert main(argv(paths, tmp_path / "out", "--oos", str(paths[name]))) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "mini.queries.jsonl").open()]
    oos = [(r["query_id"], r["query"], r["query_type"], r["scope"]) for r in records if r["scope"] == "oos"]
    assert oos == [("901", "what articles deal with time sharing systems?", "off_topic", "oos"),
                   ("902", "parallel sorting networks", "off_topic", "oos")]


def test_smart_queries_as_the_in_scope_set(tmp_path: Path):
    smart = ".I q1\n.W\nwing flutter\n.I q2\n.T\nboundary layer heat transfer\n.I q3\n.W\nshell buckling\n"
    paths = write_inputs(tmp_path / "in", **{"queries.qry": smart})
    assert main(argv(paths, tmp_path / "out", queries="queries.qry")) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "mini.queries.jsonl").open()]
    assert [(r["query_id"], r["query"], r["scope"]) for r in records] == [
        ("q1", "wing flutter", "in"), ("q2", "boundary layer heat transfer", "in"), ("q3", "shell buckling", "in")]


def test_oos_queries_no_run_ranks_are_counted_and_named(tmp_path: Path, capsys):
    oos = _jsonl([{"query_id": f"o{i}", "query": f"reset my password {i}"} for i in range(1, 6)])
    paths = write_inputs(tmp_path / "in", **{"oos.jsonl": oos})
    assert main(argv(paths, tmp_path / "out", "--oos", str(paths["oos.jsonl"]))) == 0
    out = capsys.readouterr().out
    assert ("warning: 5 of 5 out-of-scope queries get no candidates from any source (no run ranks them: "
            "o1, o2, o3, ...): the backend hands them off under every config") in out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["oos_without_candidates"] == ["o1", "o2", "o3", "o4", "o5"]
    # a run that ranks two of them: the other three are named
    ranked = RUN_A + "o1 Q0 d2 1 1.5 a\no4 Q0 d3 1 1.0 a\n"
    paths = write_inputs(tmp_path / "in2", **{"oos.jsonl": oos, "a.run": ranked})
    assert main(argv(paths, tmp_path / "out2", "--oos", str(paths["oos.jsonl"]))) == 0
    assert "warning: 3 of 5 out-of-scope queries get no candidates from any source (no run ranks them: o2, o3, o5)" \
        in capsys.readouterr().out
    # bm25 and dense next to the runs retrieve for every query: nothing to say
    assert main(argv(paths, tmp_path / "out3", "--oos", str(paths["oos.jsonl"]), "--with-lexical")) == 0
    assert "no candidates" not in capsys.readouterr().out


# --- a corpus from the runs' own passages (issue 26) ----------------------------------------

RUN_WITH_PASSAGES = [
    {"qid": "q1", "hits": [{"docid": "d1", "score": 2.0, "text": "flutter of swept  wings", "title": "Wing flutter"},
                           {"docid": "d4", "score": 1.0, "contents": "shock wave and boundary layer"}]},
    {"qid": "q2", "hits": [{"docid": "d2", "score": 3.0, "raw": json.dumps({"id": "d2", "contents": "heat transfer"})},
                           {"docid": "d1", "score": 0.5, "text": "another copy is ignored"}]},
    {"qid": "q3", "hits": [{"docid": "d3", "score": 1.0, "content": "buckling of thin shells"}]},
]


def test_the_corpus_can_come_from_the_runs_passages(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path / "in", **{"p.json": json.dumps(RUN_WITH_PASSAGES)})
    out = tmp_path / "out"
    args = ["files", "--name", "mini", "--queries", str(paths["queries.jsonl"]), "--qrels", str(paths["qrels.txt"]),
            "--run", f"p={paths['p.json']}", "--out", str(out)]
    assert main(args) == 0
    assert "corpus: the 4 passages the runs carry (no --corpus)" in capsys.readouterr().out
    docs = [json.loads(line) for line in (out / "corpus.jsonl").open()]
    assert [(d["doc_id"], d["title"], d["text"]) for d in docs] == [
        ("d1", "Wing flutter", "flutter of swept wings"), ("d4", "", "shock wave and boundary layer"),
        ("d2", "", "heat transfer"), ("d3", "", "buckling of thin shells")]
    # the passages give the backend its confidence space: the bundle serves and answers
    with start_backend(out / "config.yaml") as backend:
        body = backend.search({"query": "flutter", "query_id": "q1", "top_k": 10}).json()
    assert [r["doc_id"] for r in body["results"]] == ["d1", "d4"] and body["confidence"] > 0


def test_without_a_corpus_runs_must_carry_passages(tmp_path: Path, capsys):
    paths = write_inputs(tmp_path / "in")
    args = ["files", "--name", "mini", "--queries", str(paths["queries.jsonl"]), "--qrels", str(paths["qrels.txt"]),
            "--run", f"lex={paths['a.run']}", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no --corpus given and no run hit carries passage text" in err
    assert "pass the corpus file to --corpus" in err and "\n" not in err


@pytest.mark.slow
def test_the_replay_variant_runs_a_replayed_trial_reloading_the_backend(tmp_path: Path):
    """experiment_replay.yaml beside experiment.yaml: its trial replays the fusion grid from one
    explained retrieval of the run sources and reloads the backend instead of restarting it."""
    import optuna

    paths = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    assert main(argv(paths, out)) == 0
    tuner = Path(sys.executable).parent / "tuner"
    proc = subprocess.run([str(tuner), "run", str(out / "experiment_replay.yaml"), "--n-trials", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fusion replay: 3 explained answers replay exactly" in proc.stdout
    assert "trials reload the backend's config" in proc.stdout
    study = optuna.load_study(study_name="mini-replay", storage=f"sqlite:///{out / '.tuner' / 'optuna.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2 and done[0].user_attrs["variant"] == "baseline"
    assert any(t.user_attrs.get("applied") == "reload" for t in done)
    # no OOS queries and no constraint: the trial lines say n/a, not "0.000 feasible"
    assert re.search(r"#1 +score \d\.\d{4}  OOS FP n/a +n/a ", proc.stdout), proc.stdout
