"""One function per metric, each over all queries at once.

Every function takes a RankingBatch and a cutoff ``k`` (None = the whole ranking) and
returns one float per query. Positions past the end of a ranking hold grade 0, so a
short or empty ranking simply scores lower; nothing divides by the ranking length.
Formulas are written out in docs/metrics.md.

Binary metrics (P, Recall, Success, MRR, AP) count a document as
relevant when its grade >= ``batch.relevance_level`` (trec_eval's ``-l``, default 1).
The Strong_ / Exact_ variants name their own level and graded metrics (NDCG, DCG,
ERR, Avg_Grade, Gain_Recall, graded MAP) use the grades themselves, so ``-l`` leaves
them alone: trec_eval's ndcg ignores ``-l`` too (checked against out.test.aql).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tuner.metrics.batch import RankingBatch

STRONG = 2  # grade >= 2: Mostly or Fully relevant
USEFUL = 1  # grade >= 1: at least Weakly relevant (graded MAP's R; -l does not move it)


@lru_cache(maxsize=8)
def _discount(n: int) -> np.ndarray:
    """1 / log2(rank + 1) for ranks 1..n (trec_eval's ndcg discount)."""
    discount = 1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64))
    discount.setflags(write=False)
    return discount


def _cut(k: int | None, width: int) -> int:
    return width if k is None else min(k, width)


def _per_position(k: int | None, batch: RankingBatch) -> int:
    """Denominator of precision-style metrics: k, like trec_eval's P_k."""
    return batch.depth if k is None else k


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den == 0 (a query with nothing relevant scores 0)."""
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast(num, den).shape)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _first_rank(hits: np.ndarray) -> np.ndarray:
    """1-based rank of the first True per row, 0 when there is none."""
    found = hits.any(axis=1)
    return np.where(found, hits.argmax(axis=1) + 1, 0)


def dcg(batch: RankingBatch, k: int | None) -> np.ndarray:
    """DCG@k = sum_{r<=k} gain(g_r) / log2(r + 1)."""
    gains = batch.gain_matrix[:, : _cut(k, batch.depth)]
    return gains @ _discount(gains.shape[1])


def ndcg(batch: RankingBatch, k: int | None) -> np.ndarray:
    """NDCG@k = DCG@k / IDCG@k; the ideal ranks every judged document best first."""
    ideal = batch.ideal_gain_matrix[:, : _cut(k, batch.ideal_grades.shape[1])]
    return _safe_div(dcg(batch, k), ideal @ _discount(ideal.shape[1]))


def err(batch: RankingBatch, k: int | None) -> np.ndarray:
    """ERR@k = sum_r (1/r) R_r prod_{j<r} (1 - R_j), R = gain(g) / (gain(max) + 1).

    With exp gains R = (2^g - 1) / 2^max, Chapelle et al.'s stopping probability.
    """
    gains = batch.gain_matrix[:, : _cut(k, batch.depth)]
    stop = gains / (batch.gain_values[-1] + 1.0)
    reach = np.cumprod(1.0 - stop, axis=1)
    reach = np.hstack([np.ones((stop.shape[0], 1)), reach[:, :-1]])
    ranks = np.arange(1, stop.shape[1] + 1, dtype=np.float64)
    return (stop * reach / ranks).sum(axis=1)


def _precision_at_least(batch: RankingBatch, k: int | None, min_grade: int) -> np.ndarray:
    hits = (batch.top(k) >= min_grade).sum(axis=1)
    return hits / _per_position(k, batch)


def precision(batch: RankingBatch, k: int | None) -> np.ndarray:
    """P@k = |{r <= k : g_r >= L}| / k, L = relevance level (trec_eval P_k at -l L)."""
    return _precision_at_least(batch, k, batch.relevance_level)


def useful_precision(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Useful_Precision@k = |{r <= k : g_r >= 1}| / k. Named by its level like the
    Strong_ / Exact_ variants, so it (and Primary_Metric_Score) ignores -l."""
    return _precision_at_least(batch, k, 1)


def strong_precision(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Strong_Precision@k = |{r <= k : g_r >= 2}| / k."""
    return _precision_at_least(batch, k, STRONG)


def exact_precision(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Exact_Precision@k = |{r <= k : g_r = max grade}| / k."""
    return (batch.top(k) == batch.max_grade).sum(axis=1) / _per_position(k, batch)


def avg_grade(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Avg_Grade@k = sum_{r<=k} g_r / k; missing positions count as grade 0."""
    return batch.top(k).sum(axis=1, dtype=np.int64) / _per_position(k, batch)


def gain_recall(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Gain_Recall@k = sum_{r<=k} gain(g_r) / sum of gains of all judged documents."""
    gained = batch.gain_matrix[:, : _cut(k, batch.depth)].sum(axis=1)
    return _safe_div(gained, batch.total_gain)


def recall(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Recall@k = |{r <= k : g_r >= L}| / |{judged d : g_d >= L}| (trec_eval recall_k)."""
    level = batch.relevance_level
    hits = (batch.top(k) >= level).sum(axis=1)
    return _safe_div(hits, batch.relevant_count(level))


def _success_at_least(batch: RankingBatch, k: int | None, min_grade: int) -> np.ndarray:
    return np.asarray((batch.top(k) >= min_grade).any(axis=1), dtype=np.float64)


def success(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Success@k = 1 if some g_r >= L with r <= k, else 0 (trec_eval success_k)."""
    return _success_at_least(batch, k, batch.relevance_level)


def strong_success(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Strong_Success@k = 1 if some g_r >= 2 with r <= k, else 0."""
    return _success_at_least(batch, k, STRONG)


def exact_success(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Exact_Success@k = 1 if some g_r = max grade with r <= k, else 0."""
    return _success_at_least(batch, k, batch.max_grade)


def _reciprocal_rank_at_least(batch: RankingBatch, k: int | None, min_grade: int) -> np.ndarray:
    first = _first_rank(batch.top(k) >= min_grade)
    return _safe_div(np.ones(first.shape), first)


def mrr(batch: RankingBatch, k: int | None) -> np.ndarray:
    """RR@k = 1 / rank of the first g_r >= L within k, else 0 (trec_eval recip_rank)."""
    return _reciprocal_rank_at_least(batch, k, batch.relevance_level)


def mrr_strong(batch: RankingBatch, k: int | None) -> np.ndarray:
    """MRR_Strong@k = 1 / rank of the first g_r >= 2 within k, else 0."""
    return _reciprocal_rank_at_least(batch, k, STRONG)


def mrr_exact(batch: RankingBatch, k: int | None) -> np.ndarray:
    """MRR_Exact@k = 1 / rank of the first g_r = max grade within k, else 0."""
    return _reciprocal_rank_at_least(batch, k, batch.max_grade)


def average_precision(batch: RankingBatch, k: int | None) -> np.ndarray:
    """AP@k = sum_{r<=k, g_r>=L} P@r / |{judged d : g_d >= L}| (trec_eval map, map_cut_k)."""
    level = batch.relevance_level
    hits = (batch.top(k) >= level).astype(np.float64)
    precision_at = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)
    return _safe_div((precision_at * hits).sum(axis=1), batch.relevant_count(level))


def graded_map(batch: RankingBatch, k: int | None) -> np.ndarray:
    """MAP@k, graded: sum_{r<=k, g_r>0} wP@r / min(k, R), w = g / max grade.

    wP@r = (1/r) sum_{j<=r} w_j is precision with graded weights; R counts judged
    documents with g >= 1. With 0/1 grades this is AP@k normalised by min(k, R).
    Not trec_eval's map / map_cut_k (that is AP / AP@k). R stays at g >= 1 under any
    relevance level: every g > 0 earns weight, so a perfect ranking must still score 1.
    """
    top = batch.top(k)
    weights = top / batch.max_grade
    weighted_precision = np.cumsum(weights, axis=1) / np.arange(1, top.shape[1] + 1)
    summed = np.where(top > 0, weighted_precision, 0.0).sum(axis=1)
    relevant = batch.relevant_count(USEFUL)
    return _safe_div(summed, relevant if k is None else np.minimum(relevant, k))


def judged(batch: RankingBatch, k: int | None) -> np.ndarray:
    """Judged@k = judged documents among the first min(k, length) / min(k, length).

    Coverage, not quality: NaN for an empty ranking (nothing to judge), which
    pandas' mean skips.
    """
    shown = np.minimum(batch.lengths, _per_position(k, batch))
    labelled = batch.judged[:, : _cut(k, batch.depth)].sum(axis=1)
    return np.divide(labelled, shown, out=np.full(shown.shape, np.nan), where=shown > 0)
