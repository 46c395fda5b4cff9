"""The ready-to-tune files every importer writes next to the data.

* ``config.yaml``      a reference-backend config: the corpus, one ``type: run`` source
  per run given, else (or with ``--with-lexical`` as well) ``bm25`` + ``dense``; equal
  fusion weights; a confidence threshold of 0 and ``citation.min_score`` 0, so the
  baseline answers every query instead of silently handing some off.
* ``space.yaml``       fusion method, RRF k, the weights simplex over the fused sources,
  normalisation, and the two gates as ``post_retrieval`` floats (the confidence gate
  only when the corpus has text: over a stub corpus every confidence is 0).
* ``experiment.yaml``  a process target serving ``config.yaml``, the request body with
  ``query_id`` (run sources are looked up by it: without it they return nothing), the
  query set and qrels by their dataset name, ``OOS_FP_Rate <= 0.10`` only when the query
  set has out-of-scope queries, ``project_root: .`` so the study, label store and
  MLflow runs stay in this folder, and the data the backend serves (the corpus and the
  run files) as ``target.inputs`` plus the backend's ``data_fingerprint`` as
  ``target.health.fingerprint``: both are part of the tuner's result-cache key, so
  re-importing changed data never reuses results measured on the old data. Each trial
  *reloads* the backend (``target.reload``: ``POST /admin/reload``, confirmed by the
  served config's fingerprint) instead of restarting it; an index setting restarts it.
* ``experiment_replay.yaml``  the same study with the fusion params replayed
  (``replay:``, docs/tuning.md "Fusion replay"): each trial retrieves once, explained,
  and scores the whole fusion grid from it; with the gates solved too, one trial covers
  the importer's whole space. Its study is ``NAME-replay``.

Every path is relative to the file that holds it, so the folder can be moved whole.
Rendering is pure text (comments kept), no YAML library needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .dataset import CORPUS_FILE, Dataset, file_names
from .errors import DataFormatError

CONFIG_FILE = "config.yaml"
SPACE_FILE = "space.yaml"
EXPERIMENT_FILE = "experiment.yaml"
REPLAY_FILE = "experiment_replay.yaml"
N_TRIALS = 30
OOS_BOUND = 0.10
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")  # a path YAML reads as itself unquoted


@dataclass(frozen=True)
class Sources:
    """The backend sources of a ready config; ``dense`` is always there (the confidence space)."""

    runs: dict[str, str]  # source name -> run path relative to the bundle
    bm25: str | None  # lexical source name, None when not served
    dense: str
    dense_enabled: bool

    @property
    def fused(self) -> list[str]:
        lexical = [self.bm25] if self.bm25 else []
        return [*self.runs, *lexical, *([self.dense] if self.dense_enabled else [])]


def plan_sources(runs: Mapping[str, str], *, with_lexical: bool, has_text: bool) -> Sources:
    """bm25 + dense when no runs are given or ``with_lexical``; names never clash with a run's."""
    lexical = with_lexical or not runs
    if lexical and not has_text:
        problem = "bm25 and dense need document text, and the corpus has none (no --docs)"
        fix = "pass --docs with the documents" + (", or drop --with-lexical" if runs else ", or give --run files")
        raise DataFormatError.at("--with-lexical" if runs else "--docs", None, problem, fix)
    taken = set(runs)
    bm25 = _free("bm25", taken) if lexical else None
    dense = _free("dense", taken if bm25 is None else taken | {bm25})
    return Sources(dict(runs), bm25, dense, lexical)


def _free(preferred: str, taken: set[str]) -> str:
    return next(n for n in (preferred, f"{preferred}_local", f"{preferred}_local2") if n not in taken)


def ready_files(dataset: Dataset, runs: Mapping[str, str], *, with_lexical: bool = False) -> dict[str, str]:
    has_text = any(d.title.strip() or d.text.strip() for d in dataset.documents)
    sources = plan_sources(runs, with_lexical=with_lexical, has_text=has_text)
    n_oos = sum(1 for q in dataset.queries if q.scope == "oos")
    inputs = [CORPUS_FILE, *sources.runs.values()]
    return {
        CONFIG_FILE: render_config(dataset.name, sources),
        SPACE_FILE: render_space(dataset.name, sources, confidence_gate=has_text),
        EXPERIMENT_FILE: render_experiment(dataset.name, n_oos, inputs=inputs),
        REPLAY_FILE: render_experiment(dataset.name, n_oos, inputs=inputs, replay=sources.fused),
    }


# ---------------------------------------------------------------- config.yaml


def render_config(name: str, sources: Sources) -> str:
    runs = "".join(f"    {n}: {p}\n" for n, p in sources.runs.items())
    weights = ", ".join(f"{n}: 1.0" for n in sources.fused)
    return f"""# Reference backend config for the {name} data set, written by the importer.
# Relative paths are resolved against the directory of this file.
# Serve it: python -m fusion_backend serve --config config.yaml

data:
  corpus: {CORPUS_FILE}
  index_cache: .cache/index        # on-disk index cache, keyed by corpus + retrieval settings
  runs:{" {}" if not runs else ""}
{runs}
server:
  host: 127.0.0.1
  port: 8080                       # the --port flag overrides this (the tuner passes one)

sources:
{_source_blocks(sources)}
fusion:
  method: rrf                      # rrf | linear
  rrf_k: 60                        # RRF: score = sum over sources of w_s / (k + rank_s)
  weights: {{{weights}}}
  normalization: minmax            # linear fusion only: minmax | z

confidence:
  # 0 hands off nothing on confidence: a higher default silently hands off ordinary
  # queries (0.6 handed off 46% of Cranfield's). The study tunes it (space.yaml).
  threshold: 0.0
  top_m: 3                         # confidence = mean cosine(query, top-m fused hits) in the dense space

citation:
  min_score: 0.0                   # drop results whose normalised score (0..1) is below this

fallback:
  windows_days: [30, 90]           # date windows tried after a request's primary date filter

recency:
  half_life_days: 30
  weight: 0.0                      # 0 disables the recency boost
"""


def _source_blocks(sources: Sources) -> str:
    out = ""
    for name in sources.runs:
        out += (
            f"  {name}:\n    type: run                      # looked up by the request's query_id\n"
            f"    enabled: true\n    depth: 100\n"
        )
    if sources.bm25:
        out += f"  {sources.bm25}:\n    type: bm25\n    enabled: true\n    depth: 100\n    k1: 1.5\n    b: 0.75\n"
    why = "" if sources.dense_enabled else "                 # not fused: kept as the confidence space"
    out += (
        f"  {sources.dense}:\n    type: dense\n    enabled: {str(sources.dense_enabled).lower()}{why}\n"
        f"    depth: 100\n    embedder: lsa                  # TF-IDF + TruncatedSVD fitted on the corpus\n"
        f"    dims: 128\n    min_similarity: 0.0\n"
    )
    return out


# ---------------------------------------------------------------- space.yaml


def render_space(name: str, sources: Sources, *, confidence_gate: bool) -> str:
    fused = sources.fused
    weights = (
        f"""
  # One share per source on the simplex, written normalised to sum 1.
  fusion.weights:
    type: simplex
    components: [{", ".join(fused)}]
"""
        if len(fused) > 1
        else ""
    )
    confidence = (
        """
  # Hand off when confidence < threshold. Gate-only: solved from each trial's retrieval.
  confidence.threshold:
    type: float
    low: 0.0
    high: 0.9
    step: 0.01
    post_retrieval: true
"""
        if confidence_gate
        else ""
    )
    return f"""# Search space for the {name} data set (config.yaml), written by the importer:
# fusion over {", ".join(fused)} and the post-retrieval gates.
description: Fusion method, RRF k, weights over {", ".join(fused)} and the gates of the reference backend on {name}.

params:
  fusion.method:
    type: categorical
    choices: [rrf, linear]

  fusion.rrf_k:
    type: int
    low: 1
    high: 200
    log: true
    when: {{fusion.method: rrf}}
{weights}
  fusion.normalization:
    type: categorical
    choices: [minmax, z]
    when: {{fusion.method: linear}}
{confidence}
  # Drop results whose normalised score is below this; solved from each trial's retrieval.
  citation.min_score:
    type: float
    low: 0.0
    high: 0.5
    step: 0.01
    post_retrieval: true
"""


# ---------------------------------------------------------------- experiment.yaml


def render_experiment(
    name: str, n_oos: int, *, inputs: Sequence[str] = (CORPUS_FILE,), replay: Sequence[str] | None = None
) -> str:
    """The experiment; with ``replay`` (the fused sources) its fusion-replay variant."""
    queries, qrels = file_names(name, named=True)
    input_list = ", ".join(p if _PLAIN.fullmatch(p) else json.dumps(p) for p in dict.fromkeys(inputs))
    if n_oos:
        constraints = (
            f"# {n_oos} out-of-scope queries: answering more than {OOS_BOUND:.0%} of them is infeasible\n"
            f"# (the rate moves in steps of 1/{n_oos}).\nconstraints:\n  - OOS_FP_Rate <= {OOS_BOUND:.2f}\n"
        )
    else:
        constraints = (
            "# No out-of-scope queries in the query set, so no OOS_FP_Rate bound: it could never bind.\n"
            "constraints: []\n"
        )
    if replay is None:
        head = f"""# Tune the reference backend on the {name} data set:
#
#   tuner run experiment.yaml
#
# (experiment_replay.yaml, beside it, replays the fusion params instead of sampling them.)
# Written by the importer. Paths are relative to this file, so the folder moves as a
# whole; project_root: . keeps the study (.tuner/) and MLflow runs (mlruns/) in it too.
study: {json.dumps(name)}
description: Fusion and gates of the reference backend on the {name} data set.
"""
    else:
        head = f"""# Tune the reference backend on the {name} data set with fusion replay:
#
#   tuner run experiment_replay.yaml
#
# experiment.yaml with a replay: section (docs/tuning.md, "Fusion replay"): the fusion
# params are not sampled; each trial retrieves once with the backend explaining each
# search, scores the whole fusion grid from that retrieval (the gates solved on each
# setting), then serves the best setting and measures it live. With every tuned param
# replayed or solved, one trial covers the space and `tuner run` stops after it.
# Written by the importer; paths are relative to this file.
study: {json.dumps(name + "-replay")}
description: Fusion (replayed) and gates of the reference backend on the {name} data set.
"""
    return (
        head
        + f"""project_root: .

sampler: {{type: tpe, seed: 42, multivariate: true, n_startup_trials: 10}}
pruner: {{type: none}}
n_trials: {N_TRIALS}

objective: {{metric: Primary_Metric_Score, direction: maximize}}
{constraints}failure_budget: {{max_consecutive: 3, max_total: 10}}

dataset:
  queries: {queries}
  dataset_id: {json.dumps(name)}
  labels:
    - {{path: {qrels}, format: qrels}}

target:
  config_files: [{CONFIG_FILE}]
  # The data the backend serves: its content is part of the result-cache key.
  inputs: [{input_list}]
  apply: process
  port: auto
  process:
    command: ["{{python}}", -m, fusion_backend, serve, --config, "{{config}}", --port, "{{port}}"]
    cwd: .
    stop_timeout_s: 10
  # The backend takes a new config without a restart: each trial reloads it and the tuner
  # checks that /health reports the sha256 of the file it wrote. An index setting
  # (restart_keys) restarts it instead.
  reload:
    http: {{url: "http://127.0.0.1:{{port}}/admin/reload", method: POST}}
    fingerprint: config_fingerprint
    restart_keys: [data, server, "sources.*.k1", "sources.*.b", "sources.*.embedder", "sources.*.dims"]
  health:
    url: http://127.0.0.1:{{port}}/health
    deadline_s: 300                # the first start builds the index
    interval_s: 0.2
    fingerprint: data_fingerprint  # the backend's hash of the data it loaded (cache key too)

evaluation:
  request:
    url: http://127.0.0.1:{{port}}/search
    # query_id is required: run sources are looked up by it and return nothing without it.
    body: {{query: "{{query}}", top_k: "{{top_k}}", query_id: "{{query_id}}"}}
  response:
    results_path: results
    doc_id: doc_id
    score: score
    title: title
    confidence: confidence
    handoff: handoff
    handoff_reason: handoff_reason   # which config key handed a query off (quoted by the preflight)
    fallback_level: fallback_level
  top_k: 50
  concurrency: 4

search_space: {SPACE_FILE}
{_replay_section(replay)}baseline: true

tracking:
  enabled: true
"""
    )


def _replay_section(fused: Sequence[str] | None) -> str:
    """The replay: section over the space's fusion params (weights only with two sources)."""
    if fused is None:
        return ""
    weights = "    fusion.weights: weights\n" if len(fused) > 1 else ""
    return (
        "# The fusion params are searched inside each trial from one explained retrieval\n"
        '# ("explain": true goes into the request body of that retrieval).\n'
        "replay:\n  params:\n    fusion.method: method\n    fusion.rrf_k: rrf_k\n"
        f"{weights}    fusion.normalization: normalization\n"
    )
