"""Cached retrieval for the tuning benchmarks: thousands of trial evaluations in minutes.

A real trial patches the config, restarts the backend, waits for health and sends
every query over HTTP: seconds per trial. The benchmarks here compare *search
strategies* (samplers, pruning, threshold solving), which needs thousands of trial
evaluations, so they run the reference backend's own search code in process:

- the index (BM25 postings, LSA embeddings) is built once per data set;
- the per-query scorer outputs that no tuned parameter changes (BM25 scores of the
  query's tokens, the query embedding) are memoised, so a trial pays only for what
  its parameters do change;
- each trial builds the backend's ``Searcher`` on the trial's config and runs every
  query through it: the same fusion formula, recency, citation filter, date tiers
  and confidence gate as the served backend (not a re-implementation);
- the responses go through the tuner's evaluation core (``evaluate_responses``), so
  the scores are the ones a live study would record.

``CachedBackend.verify(port)`` compares one configuration against the live HTTP
service (the benchmarks can call it with --verify) to show the shortcut changes no
number.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fusion_backend.config import load_config
from fusion_backend.index import load_index
from fusion_backend.search import Searcher, SearchRequest
from ruamel.yaml import YAML

from tuner.data.dataset import QuerySet, load_queryset
from tuner.data.qrels import read_qrels
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import BatchResult, evaluate_responses

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"
TOP_K = 50


def demo_bundle(out: Path) -> Path:
    from fusion_backend.datagen.demo import write_demo

    write_demo(out)
    return out


def cranfield_bundle(out: Path, n_oos: int = 25) -> Path:
    from fusion_backend.importers.cranfield import import_cranfield
    from fusion_backend.importers.dataset import write_dataset

    if not (SHARED / "cranfield").is_dir():
        raise SystemExit(f"Cranfield not found at {SHARED / 'cranfield'}; run with --datasets demo")
    write_dataset(import_cranfield(SHARED / "cranfield", oos_from_cacm=n_oos, cacm_src=SHARED / "cacm"), out)
    return out


def bundle(name: str, work: Path) -> Path:
    out = work / name
    return demo_bundle(out) if name == "demo" else cranfield_bundle(out)


class CachedBackend:
    """The reference backend on one data bundle, evaluated in process per config."""

    def __init__(self, bundle_dir: Path, work_dir: Path | None = None) -> None:
        self.work = Path(work_dir or tempfile.mkdtemp(prefix="bench-backend-"))
        self.work.mkdir(parents=True, exist_ok=True)
        base = YAML(typ="safe").load((REPO / "backend" / "config.yaml").read_text())
        base["data"] = {"corpus": str(bundle_dir / "corpus.jsonl"), "index_cache": str(self.work / "index"), "runs": {}}
        self.base = base
        self.config_path = self.work / "config.yaml"
        self._write(self.config_path, base)
        cfg = load_config(self.config_path)
        self.index = load_index(cfg)
        self._memoise()
        self.queries: QuerySet = load_queryset(bundle_dir / "queries.jsonl")
        self.qrels = read_qrels(bundle_dir / "qrels.txt")
        self.evaluations = 0  # query evaluations served (for the pruning benchmark)

    def _memoise(self) -> None:
        emb = self.index.embedder
        embed = functools.lru_cache(maxsize=None)(emb.embed)
        emb.embed = embed  # type: ignore[method-assign]
        for retriever in self.index.bm25.values():
            scores = functools.lru_cache(maxsize=None)(lambda toks, _f=retriever.scores: _f(list(toks)))
            retriever.scores = lambda tokens, _s=scores: _s(tuple(tokens))  # type: ignore[method-assign]

    def config(self, assignment: Mapping[str, Any]):  # noqa: ANN201 - fusion_backend Config
        doc = copy.deepcopy(self.base)
        for path, value in assignment.items():
            node = doc
            *parents, leaf = path.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = list(value) if isinstance(value, tuple) else value
        path = self.work / "trial.yaml"
        self._write(path, doc)
        return load_config(path)  # the backend's own validation, as on a restart

    def search_all(self, assignment: Mapping[str, Any]) -> list[QueryResponse]:
        searcher = Searcher(self.index, self.config(assignment))
        out = []
        for q in self.queries:
            outcome = searcher.search(_request(q))
            hits = tuple(Hit(h.doc_id, h.score, h.title) for h in outcome.hits)
            parsed = ParsedResponse(hits, outcome.confidence, outcome.handoff, outcome.fallback_level)
            out.append(QueryResponse(q.query_id, "bench", parsed))
        return out

    def evaluate(self, assignment: Mapping[str, Any]) -> BatchResult:
        responses = self.search_all(assignment)
        self.evaluations += len(responses)
        return evaluate_responses(self.queries, self.qrels, responses)

    def verify(self, assignment: Mapping[str, Any]) -> tuple[float, float]:
        """(cached, live) Primary_Metric_Score of one config: the live one from the real
        service started on a free port and queried over HTTP by the tuner's run_batch."""
        import subprocess
        import sys
        import time

        import httpx

        from tuner.config.experiment import free_port
        from tuner.evaluation.batch import run_batch
        from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

        cfg_path = self.work / "verify.yaml"
        doc = copy.deepcopy(self.base)
        self._write(cfg_path, doc)
        self.config(assignment)
        (self.work / "trial.yaml").replace(cfg_path)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "fusion_backend", "serve", "--config", str(cfg_path),
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            spec = EvalSpec(request=RequestMapping(url=f"http://127.0.0.1:{port}/search",
                                                   body={"query": "{query}", "top_k": "{top_k}"}),
                            response=ResponseMapping(confidence="confidence", handoff="handoff",
                                                     fallback_level="fallback_level"),
                            top_k=TOP_K)
            live = run_batch(spec, self.queries, self.qrels)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        return self.evaluate(assignment).primary, live.primary

    @staticmethod
    def _write(path: Path, doc: Mapping[str, Any]) -> None:
        yaml = YAML(typ="safe")
        yaml.default_flow_style = False
        with path.open("w") as fh:
            yaml.dump(dict(doc), fh)


def _request(q) -> SearchRequest:  # noqa: ANN001 - tuner.data.dataset.Query
    extra = dict(q.extra)

    def day(key: str) -> dt.date | None:
        value = extra.get(key)
        return dt.date.fromisoformat(value) if isinstance(value, str) else None

    hint = extra.get("date_hint_days")
    return SearchRequest(query=q.query, top_k=TOP_K, date_from=day("date_from"), date_to=day("date_to"),
                         date_hint_days=int(hint) if hint is not None else None, now=day("now"),
                         query_id=q.query_id)
