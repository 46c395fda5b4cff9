"""An explained retrieval read from each hit's per-source sub-scores (pure): what lets an
engine that takes its fusion parameters in the request, and shows its sub-scores in a
debug answer, be replayed (tuner.evaluation.fusion_replay) without candidate lists.

Azure AI Search with ``debug: "vector"`` gives every hit its text query's
``searchScore`` and, per vector query, that query's ``searchScore`` (``{}`` when the
query did not retrieve the hit), under ``@search.documentDebugInfo``. A declared
``SubscoreMapping`` says where a hit holds each source's score and / or rank (response
paths relative to the hit, tuner.evaluation.paths); ``explained_from_answer`` turns one
answer into the ``Explained`` that replay reads: one date tier, each source's list the
hits that carry its sub-score, in rank order.

What the sub-scores can and cannot reproduce:

- a hit without a source's sub-score is not in that source's list (the engine's
  meaning: not in its window), so it adds nothing for that source, as in the engine;
- the lists are only complete when the answer lists every candidate of every source:
  the explained request asks for a long answer (Azure: ``top``) and an answer as long
  as that cap (``limit``) fails, since it may have cut candidates;
- a rank read from a score is the position in the source's list by descending score.
  Sources tie (BM25 gives equal scores to equal term statistics), and the engine breaks
  the tie by an order the answer does not show (its index order). For RRF the fused
  score shows it: a tied hit's rank in the source is what its fused score leaves once
  its other sources' shares are taken off (``w / (fused - others) - k``), so the tied
  hits are put in that order; otherwise (linear fusion, no fused score mapped) in their
  place in the answer. The fused ranking's own ties are ordered by place in the served
  answer, which is the engine's order at the served setting. An engine that differs
  scores differently at the served setting, and the served-setting check
  (tuner.evaluation.explain_batch.served_mismatch) refuses it rather than trust it;
- a declared rank must run 1, 2, 3, ... in each list: a gap is a candidate the answer
  lacks;
- RRF reads only the ranks; a linear fusion reads the scores and must normalise them as
  the engine does (``fusion.normalization``), over the same lists;
- no date tiers, recency, confidence or citation cut: the setting served is the engine's
  plain fusion (``FusionSetting`` with every gate at 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.errors import ResponseMappingError
from tuner.evaluation.fusion_replay import Explained, FusionSetting
from tuner.evaluation.mapping import _MISSING, parse_response, resolve_path
from tuner.evaluation.paths import split_path
from tuner.evaluation.spec import ResponseMapping

#: the one date tier of an answer read from sub-scores
TIER = "primary"


@dataclass(frozen=True)
class SourcePaths:
    """Where a hit holds one source's sub-score and / or rank (at least one)."""

    score: str | None = None
    rank: str | None = None


@dataclass(frozen=True)
class SubscoreMapping:
    """Each source's paths in a hit (in the engine's source order), and the answer's
    cap: the value of the explained request's ``limit`` field (None: unchecked)."""

    sources: Mapping[str, SourcePaths]
    limit: int | None = None


@dataclass(frozen=True)
class SubscoreReader:
    """Reads each answer of the explained retrieval (tuner.evaluation.explain_batch):
    its ``Explained`` from the sub-scores, and the setting it was served at (known from
    the request the tuner sent, not from the answer)."""

    mapping: SubscoreMapping
    response: ResponseMapping
    served_setting: FusionSetting

    #: what the explained retrieval's error names when an answer cannot be read
    what = "sub-scores"

    def read(self, payload: Any, query_id: str) -> tuple[Explained, FusionSetting] | None:
        """None when the answer has hits but none carries a sub-score (debug not on, or
        every path wrong): not an answer to replay."""
        explained = explained_from_answer(payload, self.response, self.mapping, query_id, self.served_setting)
        lists = explained.tiers[0][1].values()
        if explained.doc_ids and all(len(docs) == 0 for docs, _ in lists):
            return None
        return explained, self.served_setting


def explained_from_answer(
    payload: Any,
    response: ResponseMapping,
    mapping: SubscoreMapping,
    query_id: str,
    served: FusionSetting | None = None,
) -> Explained:
    """One answer's ``Explained`` (module doc): documents numbered by their place in the
    answer, each source's list the hits carrying its sub-score, best first; with the
    ``served`` setting (RRF) and fused scores, a source's ties in the engine's order."""
    parsed = parse_response(payload, response, query_id)
    if parsed.repeats:
        raise ResponseMappingError(
            f"query {query_id}: the answer lists {parsed.repeats} document(s) twice; sub-score replay needs each "
            "once (the engine is not the replay model): drop replay:"
        )
    items = resolve_path(payload, response.results_path) or []
    if mapping.limit is not None and len(items) >= mapping.limit:
        raise ResponseMappingError(
            f"query {query_id}: the explained answer has {len(items)} hits, its cap (replay.subscores.limit is "
            f"{mapping.limit}), so candidates may be cut and their ranks unknown; raise that field in "
            "replay.request above the sum of the sources' windows"
        )
    lists: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, paths in mapping.sources.items():
        lists[name] = _source_list(items, name, paths, query_id)
    n = len(parsed.hits)
    fused = [h.score for h in parsed.hits]
    if served is not None and served.method == "rrf" and n and all(f is not None for f in fused):
        by_score = [name for name, paths in mapping.sources.items() if paths.rank is None]  # a rank is the engine's
        lists = _untie(lists, np.asarray(fused, dtype=np.float64), served, by_score)
    return Explained(
        sources=tuple(mapping.sources),
        today=0,
        tiers=((TIER, lists),),
        doc_ids={i: h.doc_id for i, h in enumerate(parsed.hits)},
        titles={i: h.title for i, h in enumerate(parsed.hits)},
        days=dict.fromkeys(range(n)),
        cosines=dict.fromkeys(range(n), 0.0),
    )


def _source_list(items: Sequence[Any], name: str, paths: SourcePaths, query_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(hits in the source's rank order, their scores): the hits that carry the source's
    sub-score; by declared rank, else by score descending; ties by place in the answer.
    A source read by rank only gets its ranks negated as scores (never normalised)."""
    docs: list[int] = []
    scores: list[float] = []
    ranks: list[int] = []
    score_at, rank_at = _getter(paths.score), _getter(paths.rank)
    for i, item in enumerate(items):
        score = _value(score_at(item), paths.score, name, "score", query_id, i)
        rank = _value(rank_at(item), paths.rank, name, "rank", query_id, i)
        if (paths.score is not None and score is None) or (paths.rank is not None and rank is None):
            if score is not None or rank is not None:
                raise ResponseMappingError(
                    f"query {query_id}: hit {i} has source {name}'s "
                    f"{'score' if score is not None else 'rank'} but not its {'rank' if score is not None else 'score'}"
                    "; fix replay.subscores.sources." + name
                )
            continue  # not in this source's list
        if rank is not None and (rank != int(rank) or rank < 1):
            raise ResponseMappingError(
                f"query {query_id}: hit {i}: source {name}'s rank is {rank}, not 1, 2, ...; "
                f"fix replay.subscores.sources.{name}.rank"
            )
        docs.append(i)
        scores.append(float(score) if score is not None else -float(rank or 0))
        ranks.append(int(rank) if rank is not None else 0)
    at = np.asarray(docs, dtype=np.int64)
    values = np.asarray(scores, dtype=np.float64)
    if paths.rank is not None:
        order = np.lexsort((at, np.asarray(ranks, dtype=np.int64)))
        got = np.asarray(ranks, dtype=np.int64)[order]
        expected = np.arange(1, len(order) + 1)
        if len(got) and (got != expected).any():
            k = int(np.flatnonzero(got != expected)[0])
            raise ResponseMappingError(
                f"query {query_id}: source {name}'s ranks run {got[max(0, k - 1) : k + 1].tolist()} where "
                f"{expected[max(0, k - 1) : k + 1].tolist()} were due: the answer lacks a document that source "
                "ranked (or repeats a rank); raise the answer's cap in replay.request"
            )
    else:
        order = np.lexsort((at, -values))
    return at[order], values[order]


def _untie(
    lists: dict[str, tuple[np.ndarray, np.ndarray]],
    fused: np.ndarray,
    served: FusionSetting,
    untied: Sequence[str],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The runs of tied scores of the ``untied`` sources (ranked by score) put in the
    order the fused scores imply (module doc): a tied hit's rank is ``w / (fused * scale
    - its other sources' shares) - k``. Twice over, so a hit tied in two sources is
    placed with the other's ranks settled."""
    untied = [n for n in untied if (lists[n][1][1:] == lists[n][1][:-1]).any()]
    if not untied:  # the common case: no source has a tie
        return lists
    names = list(lists)
    weights = {n: float(served.weights.get(n, 1.0)) for n in names}
    k = float(served.rrf_k)
    total = sum(weights.values()) if served.normalize_weights and not served.plain_sum else 1.0
    scale = 1.0 if served.plain_sum else total / (k + 1.0)
    out = dict(lists)
    for _ in range(2):
        ranks = {n: {int(d): r for r, d in enumerate(out[n][0].tolist(), 1)} for n in names}
        for n in untied:
            docs, scores = out[n]
            if not (scores[1:] == scores[:-1]).any():
                continue
            docs = docs.copy()
            start = 0
            while start < len(docs):
                end = start + 1
                while end < len(docs) and scores[end] == scores[start]:
                    end += 1
                if end - start > 1:
                    members = docs[start:end].tolist()
                    implied = []
                    for d in members:
                        others = sum(weights[o] / (k + ranks[o][d]) for o in names if o != n and d in ranks[o])
                        rest = float(fused[d]) * scale - others
                        implied.append(weights[n] / rest - k if rest > 0 else math.inf)
                    order = sorted(range(len(members)), key=lambda i: (implied[i], i))
                    docs[start:end] = [members[i] for i in order]
                start = end
            out[n] = (docs, scores)
    return out


def _getter(path: str | None) -> Callable[[Any], Any]:
    """``resolve_path(item, path)`` with the path split once: read for every hit of every
    answer of an explained retrieval (thousands per query), JSON's plain dicts and lists
    walked without the abstract-type checks; anything else goes through resolve_path."""
    if path is None:
        return lambda item: _MISSING
    keys = [(key, int(key) if key.lstrip("-").isdigit() else None) for key in split_path(path)]

    def get(item: Any) -> Any:
        node = item
        for key, index in keys:
            kind = type(node)
            if kind is dict:
                node = node.get(key, _MISSING)
            elif kind is list and index is not None:
                node = node[index] if -len(node) <= index < len(node) else _MISSING
            else:
                return resolve_path(item, path)
            if node is _MISSING:
                return _MISSING
        return node

    return get


def _value(raw: Any, path: str | None, name: str, what: str, query_id: str, index: int) -> float | None:
    """A hit's number ``raw`` read at ``path``: None when absent or null (not in the list)."""
    if raw is _MISSING or raw is None:
        return None
    if type(raw) is float and math.isfinite(raw):
        return raw
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ResponseMappingError(
            f"query {query_id}: hit {index}: source {name}'s {what} at '{path}' is {raw!r}, not a finite number; "
            f"fix replay.subscores.sources.{name}.{what}"
        )
    return float(raw)
