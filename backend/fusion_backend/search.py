"""One search: score every source once, then walk the date tiers until one has a hit.

Per tier: each enabled source's matching documents (BM25 score > 0; dense cosine above
``min_similarity``; listed in the run for the request's ``query_id``) inside the tier's
date window, cut to ``depth``, then fused (``fusion.*``). The first tier with any
fused document wins; its ranking gets the recency boost (``recency.*``).

The gate then reads that ranking: confidence is the mean dense cosine of its top
``confidence.top_m`` (before any cut, so it does not depend on ``top_k``);
``citation.min_score`` drops results scored below it. ``handoff`` is true when
confidence < ``confidence.threshold`` or no result survives the citation cut, and
``handoff_reason`` then names the config key responsible. None of the three changes
the ranking: from a response (each hit carries its ``similarity``,
the dense cosine) a client can replay another threshold or a higher min_score, and,
while min_score is 0, another top-m.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import fusion
from .config import Bm25Source, Config, DenseSource, RunSource, SourceConfig
from .corpus import NO_DATE, day_number
from .fallback import EMPTY, plan_tiers
from .fusion import Candidates, Fused
from .index import SearchIndex
from .scoring import confidence, recency_factor
from .text import analyze

_EPS = 1e-9  # scores equal to min_score up to float rounding are kept


@dataclass(frozen=True)
class SearchRequest:
    query: str
    top_k: int = 10
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    date_hint_days: int | None = None
    now: dt.date | None = None
    query_id: str | None = None
    explain: bool = False


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    date: str | None
    score: float
    sub_scores: dict[str, float | None]  # raw score per enabled source; None: not its candidate
    ranks: dict[str, int | None]  # 1-based rank among that source's candidates in the tier
    similarity: float  # dense cosine to the query, what the confidence averages

    def to_json(self) -> dict[str, object]:
        return {
            "doc_id": self.doc_id,
            "score": self.score,
            "title": self.title,
            "date": self.date,
            "sub_scores": self.sub_scores,
            "ranks": self.ranks,
            "similarity": self.similarity,
        }


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hit]
    confidence: float
    handoff: bool
    fallback_level: str
    handoff_reason: str | None = None  # None unless handed off
    explain: dict[str, Any] | None = None  # the request asked for it (tuner-side fusion replay)


class Searcher:
    """Stateless per request; safe to call from several threads at once."""

    def __init__(self, index: SearchIndex, cfg: Config) -> None:
        self._index = index
        self._cfg = cfg
        self._sources = cfg.enabled_sources()
        self._weights = {name: cfg.weight(name) for name in self._sources}
        # the scale fused scores are divided by (fusion.py); 1: weights taken as they are
        self._total_weight = sum(self._weights.values()) if cfg.fusion.normalize_weights else 1.0

    def search(self, req: SearchRequest, today: dt.date | None = None) -> SearchOutcome:
        cfg, docs = self._cfg, self._index.docs
        now = req.now or today or dt.date.today()
        cosines = self._index.embedder.doc_vectors @ self._index.embedder.embed(req.query)
        tokens = analyze(req.query)
        ranked = {name: self._rank(name, src, tokens, cosines, req.query_id) for name, src in self._sources.items()}
        tiers = plan_tiers(
            now=now,
            windows_days=cfg.fallback.windows_days,
            date_from=req.date_from,
            date_to=req.date_to,
            date_hint_days=req.date_hint_days,
        )
        tier_cands = []
        outcome = None
        for tier in tiers:
            mask = tier.mask(docs.days)
            cands = {n: _within(r, mask, self._sources[n].depth) for n, r in ranked.items()}
            tier_cands.append((tier.level, cands))
            if outcome is not None:
                continue  # only an explained request looks past the tier that answered
            fused = self._fuse(cands)
            if len(fused.docs):
                scores = fused.scores * recency_factor(
                    docs.days[fused.docs], day_number(now), cfg.recency.half_life_days, cfg.recency.weight
                )
                outcome = self._outcome(tier.level, fused.docs, scores, cands, cosines, req.top_k, tokens)
                if not req.explain:
                    return outcome
        if outcome is None:
            outcome = SearchOutcome([], 0.0, True, EMPTY, self._no_candidates(req))
        if req.explain:
            outcome = replace(outcome, explain=self._explain(tier_cands, cosines, day_number(now)))
        return outcome

    def _explain(
        self, tier_cands: list[tuple[str, dict[str, Candidates]]], cosines: np.ndarray, today: int
    ) -> dict[str, Any]:
        """Everything the ranking, the confidence and the fallback level are computed from,
        for every date tier (not only the one that answered): each enabled source's
        candidates in rank order (corpus indices, raw scores, cut to its depth), in the
        order the fusion sums them, and per candidate its id, day and dense cosine. A
        client replays any fusion weights, RRF k, normalisation, recency, citation and
        confidence setting from it exactly (ties break by corpus index)."""
        cfg, meta = self._cfg, self._index.docs
        seen: set[int] = set()
        tiers = []
        for level, cands in tier_cands:
            lists = {}
            for name, c in cands.items():
                idx = c.docs.tolist()
                seen.update(idx)
                lists[name] = {"docs": idx, "scores": c.scores.astype(np.float64).tolist()}
            tiers.append({"level": level, "sources": lists})
        days = meta.days
        return {
            "sources": list(self._sources),
            "fusion": {
                "method": cfg.fusion.method,
                "rrf_k": cfg.fusion.rrf_k,
                "normalization": cfg.fusion.normalization,
                "weights": dict(self._weights),
                "normalize_weights": cfg.fusion.normalize_weights,
            },
            "recency": {"half_life_days": cfg.recency.half_life_days, "weight": cfg.recency.weight, "today": today},
            "confidence": {"threshold": cfg.confidence.threshold, "top_m": cfg.confidence.top_m},
            "citation": {"min_score": cfg.citation.min_score},
            # only when on, so a replaying client can refuse what it cannot redo
            **({"rerank": {"depth": cfg.rerank.depth, "weight": cfg.rerank.weight}} if cfg.rerank.depth else {}),
            "tiers": tiers,
            "docs": {
                str(d): {
                    "doc_id": meta.doc_ids[d],
                    "title": meta.titles[d],
                    "date": meta.dates[d],
                    "day": None if days[d] == NO_DATE else int(days[d]),
                    "similarity": float(cosines[d]),
                }
                for d in sorted(seen)
            },
        }

    def _no_candidates(self, req: SearchRequest) -> str:
        runs = [n for n, s in self._sources.items() if isinstance(s, RunSource)]
        if runs and req.query_id is None:
            return f"no candidates (run sources {', '.join(runs)} need the request's query_id)"
        if runs and not any(str(req.query_id) in self._index.runs[n].rankings for n in runs):
            return f"no candidates (no run source ranks query_id {req.query_id!r})"
        return "no candidates"

    def _rank(
        self, name: str, src: SourceConfig, tokens: list[str], cosines: np.ndarray, query_id: str | None
    ) -> Candidates:
        if isinstance(src, Bm25Source):
            return _ranked(self._index.bm25[name].scores(tokens))
        if isinstance(src, DenseSource):
            return _ranked(cosines, floor=src.min_similarity)
        assert isinstance(src, RunSource)
        return Candidates(*self._index.runs[name].lookup(query_id))

    def _fuse(self, cands: dict[str, Candidates]) -> Fused:
        f = self._cfg.fusion
        if f.method == "rrf":
            return fusion.rrf(cands, self._weights, f.rrf_k, self._total_weight)
        return fusion.linear(cands, self._weights, f.normalization, self._total_weight)

    def _outcome(
        self,
        level: str,
        docs: np.ndarray,
        scores: np.ndarray,
        cands: dict[str, Candidates],
        cosines: np.ndarray,
        top_k: int,
        tokens: list[str],
    ) -> SearchOutcome:
        order = np.lexsort((docs, -scores))  # score desc, then corpus order
        docs, scores = docs[order], scores[order]
        if self._cfg.rerank.depth:
            docs, scores = self._rerank(docs, scores, tokens)
        conf = confidence(cosines[docs], self._cfg.confidence.top_m)
        cited = scores >= self._cfg.citation.min_score - _EPS
        docs, scores = docs[cited], scores[cited]
        raw = {n: dict(zip(c.docs.tolist(), c.scores.tolist(), strict=True)) for n, c in cands.items()}
        rank = {n: {d: r for r, d in enumerate(c.docs.tolist(), 1)} for n, c in cands.items()}
        meta = self._index.docs
        hits = [
            Hit(
                meta.doc_ids[d],
                meta.titles[d],
                meta.dates[d],
                float(s),
                {n: raw[n].get(d) for n in raw},
                {n: rank[n].get(d) for n in rank},
                float(cosines[d]),
            )
            for d, s in zip(docs[:top_k].tolist(), scores[:top_k].tolist(), strict=True)
        ]
        reason = handoff_reason(conf, self._cfg.confidence.threshold, self._cfg.citation.min_score, bool(hits))
        return SearchOutcome(hits, conf, reason is not None, level, reason)

    def _rerank(self, docs: np.ndarray, scores: np.ndarray, tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The top ``rerank.depth`` of a ranking (in score order) re-read: each one's title and
        text analysed again and scored by the share of the query's distinct terms it holds
        (coverage); score = (1 - weight) * score + weight * coverage, the hits below the depth
        taken with coverage 0. Real work per hit read, so a search takes longer the deeper it
        reranks (what a cross-encoder costs a real backend, without the model)."""
        rr, texts = self._cfg.rerank, self._index.docs.texts
        terms = set(tokens)
        coverage = np.zeros(len(docs), dtype=np.float64)
        if terms:
            for i, d in enumerate(docs[: rr.depth].tolist()):
                coverage[i] = len(terms.intersection(analyze(texts[d]))) / len(terms)
        blended = (1.0 - rr.weight) * scores + rr.weight * coverage
        order = np.lexsort((docs, -blended))
        return docs[order], blended[order]


def handoff_reason(conf: float, threshold: float, min_score: float, any_hit: bool) -> str | None:
    """Why a query is handed off, naming the config key(s); None when it is answered."""
    reasons = []
    if conf < threshold:
        a, b = _distinct(conf, threshold)
        reasons.append(f"confidence {a} < confidence.threshold {b}")
    if not any_hit:
        reasons.append(f"citation.min_score {_short(min_score)} left no result")
    return "; ".join(reasons) or None


def _short(x: float) -> str:
    return f"{x:.2f}" if round(x, 2) == x else repr(x)


def _distinct(a: float, b: float) -> tuple[str, str]:
    """Two decimals, or as many more as it takes for a < b not to print as equal."""
    for digits in range(2, 10):
        sa, sb = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if sa != sb:
            return sa, sb
    return repr(a), repr(b)


def _ranked(scores: np.ndarray, floor: float = 0.0) -> Candidates:
    """Documents scoring above ``floor``, best first (ties in corpus order)."""
    docs = np.flatnonzero(scores > floor)
    docs = docs[np.argsort(-scores[docs], kind="stable")]
    return Candidates(docs, scores[docs])


def _within(cands: Candidates, mask: np.ndarray | None, depth: int) -> Candidates:
    if mask is None:
        return Candidates(cands.docs[:depth], cands.scores[:depth])
    keep = mask[cands.docs]
    return Candidates(cands.docs[keep][:depth], cands.scores[keep][:depth])
