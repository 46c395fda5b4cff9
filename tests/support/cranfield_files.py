"""Cranfield as a user typically holds it: a JSONL corpus, JSONL queries, TREC qrels
and two TREC runs (the reference backend's own BM25 and LSA, scores written at full
precision), plus CACM queries as honest out-of-scope ones; and the `files` import of
that into a ready bundle. Built once per test session (tests/conftest.py fixtures
``cran_inputs`` and ``cran_bundle``): the pitfall tests and the importer tests share it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fusion_backend.config import load_config
from fusion_backend.importers import import_cranfield
from fusion_backend.index import load_index
from fusion_backend.search import Searcher, SearchRequest

from support.backend import write_backend_config

RUN_DEPTH = 100
N_OOS = 20


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def searcher(root: Path, corpus: Path, name: str, overrides: dict) -> Searcher:
    config = write_backend_config(root / f"{name}.yaml", corpus=corpus, index_cache=root / "cache",
                                  overrides=overrides)
    cfg = load_config(config)
    return Searcher(load_index(cfg), cfg)


def _backend_run(engine: Searcher, source: str, queries: list[tuple[str, str]]) -> str:
    """A TREC run of one backend source, raw scores written exactly (repr)."""
    lines = []
    for qid, text in queries:
        hits = engine.search(SearchRequest(text, top_k=RUN_DEPTH, query_id=qid)).hits
        lines += [f"{qid} Q0 {h.doc_id} {rank} {h.sub_scores[source]!r} {source}\n" for rank, h in enumerate(hits, 1)]
    return "".join(lines)


def build_inputs(datasets_dir: Path, root: Path) -> dict[str, Path]:
    """The input files, written under ``root``."""
    dataset = import_cranfield(datasets_dir / "cranfield", oos_from_cacm=N_OOS)
    corpus = _write_jsonl(root / "corpus.jsonl", [
        {"doc_id": d.doc_id, "title": d.title, "text": d.text, "date": d.date} for d in dataset.documents])
    in_scope = [q for q in dataset.queries if q.scope == "in"]
    oos = [q for q in dataset.queries if q.scope == "oos"]
    paths = {
        "corpus": corpus,
        "queries": _write_jsonl(root / "queries.jsonl", [{"query_id": q.query_id, "query": q.query} for q in in_scope]),
        "oos": _write_jsonl(root / "oos.jsonl", [{"query_id": q.query_id, "query": q.query} for q in oos]),
        "qrels": root / "qrels.trec",
    }
    paths["qrels"].write_text("".join(f"{j.query_id} 0 {j.doc_id} {j.grade}\n" for j in dataset.judgments))
    # The runs cover the out-of-scope queries too, or those would never get an answer.
    asked = [(q.query_id, q.query) for q in dataset.queries]
    no_dense = {"sources": {"dense": {"enabled": False}}}
    no_bm25 = {"sources": {"bm25": {"enabled": False}}}
    for name, source, overrides in (("bm25", "bm25", no_dense), ("lsa", "dense", no_bm25)):
        paths[name] = root / f"{name}.run"
        paths[name].write_text(_backend_run(searcher(root, corpus, name, overrides), source, asked))
    return paths


def files_argv(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["files", "--name", "cran", "--corpus", str(inputs["corpus"]), "--queries", str(inputs["queries"]),
            "--qrels", str(inputs["qrels"]), "--run", f"bm25={inputs['bm25']}", "--run", f"lsa={inputs['lsa']}",
            "--oos", str(inputs["oos"]), "--out", str(out), *extra]


def import_bundle(inputs: dict[str, Path], out: Path) -> tuple[Path, str]:
    """`python -m fusion_backend.importers files` on ``inputs`` into ``out``: (out, stdout)."""
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", *files_argv(inputs, out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"files import failed: {proc.stderr}")
    return out, proc.stdout
