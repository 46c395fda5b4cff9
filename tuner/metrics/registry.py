"""The metric registry: a metric name such as ``NDCG@23`` -> function + metadata.

A family (``NDCG``) is registered once with its function; the cutoff is parsed from
the name, so any ``k`` works without registering it. Adding a metric = one function
in functions.py + one ``_register`` line here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tuner.errors import InputError
from tuner.metrics import functions as f
from tuner.metrics.batch import RankingBatch

MetricFn = Callable[[RankingBatch, "int | None"], np.ndarray]


@dataclass(frozen=True)
class MetricFamily:
    """A metric formula with a free cutoff k."""

    name: str
    fn: MetricFn
    description: str
    needs_cutoff: bool  # False: the bare name means the whole ranking (e.g. "NDCG")
    uses_gains: bool  # True: the value depends on the gain scheme (linear / exp)
    grade_scaled: bool = False  # True: ranges over 0..max_grade instead of 0..1
    uses_ideal: bool = False  # True: reads the ideal ranking (needs every judged grade)
    binary: bool = False  # True: relevant = grade >= the relevance level (trec_eval -l)
    trec_eval: str = "none"  # the trec_eval measure it equals, so nobody maps names by guess
    #: True: dropping hits from the end of a ranking never raises it (fixed denominators, gains >= 0)
    truncation_safe: bool = True


@dataclass(frozen=True)
class Metric:
    """One concrete metric: a family at a cutoff (None = whole ranking)."""

    name: str
    family: MetricFamily
    k: int | None

    def compute(self, batch: RankingBatch) -> np.ndarray:
        return self.family.fn(batch, self.k)

    def upper_bound(self, batch: RankingBatch) -> float:
        """Best possible value; Primary_Metric_Score divides by it (Avg_Grade / 3)."""
        return float(batch.max_grade) if self.family.grade_scaled else 1.0


_FAMILIES: dict[str, MetricFamily] = {}


def _register(
    name: str,
    fn: MetricFn,
    description: str,
    *,
    needs_cutoff: bool = True,
    uses_gains: bool = False,
    grade_scaled: bool = False,
    uses_ideal: bool = False,
    binary: bool = False,
    trec_eval: str = "none",
    truncation_safe: bool = True,
) -> None:
    _FAMILIES[name] = MetricFamily(
        name, fn, description, needs_cutoff, uses_gains, grade_scaled, uses_ideal, binary, trec_eval, truncation_safe
    )


# L below is the relevance level (trec_eval -l, `tuner score -l`), default 1.
_register(
    "NDCG",
    f.ndcg,
    "normalised DCG, discount 1/log2(r+1), ideal from all judged docs",
    needs_cutoff=False,
    uses_gains=True,
    uses_ideal=True,
    trec_eval="ndcg_cut_k; bare: ndcg (linear gains; -l ignored, as trec_eval does)",
)
_register(
    "DCG",
    f.dcg,
    "discounted cumulative gain, discount 1/log2(r+1)",
    needs_cutoff=False,
    uses_gains=True,
    trec_eval="bare: dcg (linear gains, recent trec_eval; not checked here); @k: none",
)
_register(
    "ERR",
    f.err,
    "expected reciprocal rank, stop probability gain(g)/(gain(max)+1)",
    needs_cutoff=False,
    uses_gains=True,
    trec_eval="none (gdeval.pl ERR@k = exp gains, max grade 4)",
)
_register("P", f.precision, "precision at k, relevant = grade >= L, divided by k", binary=True, trec_eval="P_k")
_register(
    "Useful_Precision",
    f.useful_precision,
    "share of the top k with grade >= 1, divided by k",
    trec_eval="P_k with -l 1",
)
_register(
    "Strong_Precision",
    f.strong_precision,
    "share of the top k with grade >= 2, divided by k",
    trec_eval="P_k with -l 2",
)
_register(
    "Exact_Precision",
    f.exact_precision,
    "share of the top k with the top grade (3), divided by k",
    trec_eval="P_k with -l 3",
)
_register("Avg_Grade", f.avg_grade, "mean grade over k positions (missing = 0), 0..3", grade_scaled=True)
_register(
    "Gain_Recall",
    f.gain_recall,
    "gain in the top k / total gain of the query's judged docs",
    needs_cutoff=False,
    uses_gains=True,
)
_register(
    "Recall",
    f.recall,
    "relevant (grade >= L) in the top k / all relevant judged docs",
    needs_cutoff=False,
    binary=True,
    trec_eval="recall_k; bare: set_recall",
)
_register(
    "Success",
    f.success,
    "1 if a grade >= L doc is in the top k",
    needs_cutoff=False,
    binary=True,
    trec_eval="success_k; bare: none",
)
_register(
    "Strong_Success",
    f.strong_success,
    "1 if a grade >= 2 doc is in the top k",
    needs_cutoff=False,
    trec_eval="success_k with -l 2; bare: none",
)
_register(
    "Exact_Success",
    f.exact_success,
    "1 if a top-grade (3) doc is in the top k",
    needs_cutoff=False,
    trec_eval="success_k with -l 3; bare: none",
)
_register(
    "MRR",
    f.mrr,
    "1 / rank of the first grade >= L doc within k",
    needs_cutoff=False,
    binary=True,
    trec_eval="bare: recip_rank; @k: none",
)
_register(
    "MRR_Strong",
    f.mrr_strong,
    "1 / rank of the first grade >= 2 doc within k",
    needs_cutoff=False,
    trec_eval="bare: recip_rank with -l 2; @k: none",
)
_register(
    "MRR_Exact",
    f.mrr_exact,
    "1 / rank of the first top-grade (3) doc within k",
    needs_cutoff=False,
    trec_eval="bare: recip_rank with -l 3; @k: none",
)
_register(
    "AP",
    f.average_precision,
    "binary average precision (grade >= L), / all relevant",
    needs_cutoff=False,
    binary=True,
    trec_eval="map_cut_k; bare: map",
)
_register(
    "MAP",
    f.graded_map,
    "GRADED average precision, weights g/3, / min(k, relevant); not trec_eval map",
    trec_eval="none (trec_eval map / map_cut_k = our AP / AP@k)",
)
_register(
    "Judged",
    f.judged,
    "coverage: judged docs among the first min(k, length); NaN when empty",
    trec_eval="1 - unj_k (when >= k docs ranked)",
    truncation_safe=False,
)

_NAME = re.compile(r"^(?P<family>[A-Za-z_]+)(?:@(?P<k>\d+))?$")


@lru_cache(maxsize=1024)
def resolve(name: str) -> Metric:
    """Parse ``FAMILY@k`` (or a bare ``FAMILY`` where allowed) into a Metric (immutable, so
    each name is parsed once)."""
    match = _NAME.match(name.strip())
    family = _FAMILIES.get(match["family"]) if match else None
    if match is None or family is None:
        raise InputError(f"unknown metric {name!r}{_suggest(name)}; list them with `tuner score --list-metrics`")
    k = int(match["k"]) if match["k"] is not None else None
    if k is None and family.name == "MAP":
        # "MAP" bare is nearly always trec_eval's map; MAP@k here is a graded variant
        # that scores differently, so suggesting MAP@10 would hand over the wrong number.
        raise InputError(
            f"metric {name!r}: trec_eval's map is AP here (binary average precision over the "
            f"whole ranking; AP@k is map_cut_k); use AP, or MAP@k for the graded variant "
            f"(weights g/3), which is not trec_eval's map"
        )
    if k is None and family.needs_cutoff:
        raise InputError(f"metric {name!r} needs a cutoff; write it as {family.name}@k, e.g. {family.name}@10")
    if k is not None and k < 1:
        raise InputError(f"metric {name!r}: cutoff must be >= 1")
    return Metric(name=f"{family.name}@{k}" if k is not None else family.name, family=family, k=k)


def families() -> list[MetricFamily]:
    """Every registered metric family, in registration order."""
    return list(_FAMILIES.values())


def _suggest(name: str) -> str:
    family = name.split("@", 1)[0]
    if family.lower() == "map":  # trec_eval's lower-case map; MAP@k here is another (graded) number
        return f" (did you mean AP{name.strip()[len(family) :]}? trec_eval's map is AP here, map_cut_k is AP@k)"
    close = difflib.get_close_matches(family, list(_FAMILIES), n=1, cutoff=0.6)
    if not close:
        close = [f for f in _FAMILIES if f.lower() == family.lower()]
    return f" (did you mean {close[0]}?)" if close else ""
