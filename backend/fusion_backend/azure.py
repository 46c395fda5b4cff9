"""A search route shaped like Azure AI Search's hybrid query (``POST
/indexes/{index}/docs/search``), so a client written for Azure (and the tuner's
request channel) can be run against this service.

What Azure documents, and this route does (docs/backend.md, "Azure-shaped search"):

- the text query (``search``) is BM25 over the backend's BM25 source: its matches,
  best first, cut to ``hybridSearch.maxTextRecallSize`` (default 1000);
- each ``vectorQueries[i]`` (``kind: text``) embeds its ``text`` with the dense source's
  embedder and takes the ``k`` nearest documents by cosine (every document is a
  neighbour: no similarity floor, as an exhaustive kNN without threshold);
- with two or more lists, Reciprocal Rank Fusion with Azure's fixed constant 60:
  ``@search.score = sum_lists weight_list / (60 + rank)`` (ranks from 1; the text
  query weighs 1, a vector query its ``weight``, default 1.0, > 0); with one list,
  that list's own score (BM25, or the vector ``searchScore``);
- the vector ``searchScore`` of a cosine similarity ``c`` is ``1 / (1 + (1 - c))``,
  Azure's score for the cosine metric (0.333..1), and ``vectorSimilarity`` is ``c``;
- ``debug: "vector" | "all"`` adds ``@search.documentDebugInfo.vectors.subscores``
  (``text.searchScore``, ``vectors[i] = {<field>: {searchScore, vectorSimilarity}}``
  in request order, ``{}`` for a query that did not retrieve the document,
  ``documentBoost`` 1.0).

Ties break by corpus order. The served config's fusion, gate, date and recency keys
do not apply here: Azure's ranking has none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import Bm25Source, Config
from .text import analyze

if TYPE_CHECKING:
    from .index import SearchIndex

RRF_CONSTANT = 60  # Azure's; not configurable there either
DEFAULT_K = 50  # a vector query without k: as many as top's default
MAX_TEXT_RECALL = 1000  # Azure's default hybridSearch.maxTextRecallSize
DEBUG_MODES = ("disabled", "vector", "all")


class AzureError(Exception):
    """A request Azure would refuse: HTTP status and ``{"error": {code, message}}``."""

    def __init__(self, message: str, code: str = "InvalidRequestParameter", status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": str(self)}}


class _Model(BaseModel):
    # Azure parameters this route does not implement (select, count, queryType: simple, ...)
    # are accepted and ignored; the ones that would change the result set are refused below.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class VectorQuery(_Model):
    kind: Literal["text"]
    text: str = Field(min_length=1, max_length=10_000)
    fields: str
    k: int = Field(DEFAULT_K, ge=1, le=10_000)
    weight: float = Field(1.0, gt=0.0, le=1_000_000.0)


class HybridSearch(_Model):
    max_text_recall_size: int = Field(MAX_TEXT_RECALL, alias="maxTextRecallSize", ge=1, le=10_000)


class AzureSearchBody(_Model):
    search: str | None = Field(None, max_length=10_000)
    top: int = Field(50, ge=1, le=10_000)
    vector_queries: list[VectorQuery] = Field(default_factory=list, alias="vectorQueries", max_length=10)
    hybrid_search: HybridSearch = Field(default_factory=HybridSearch, alias="hybridSearch")
    debug: Literal["disabled", "vector", "all"] = "disabled"
    skip: int = Field(0, ge=0, le=0)  # paging is not implemented: refused rather than ignored
    filter: None = None  # OData filters are not implemented: refused rather than ignored

    @field_validator("vector_queries", mode="before")
    @classmethod
    def _list(cls, value: Any) -> Any:
        return [] if value is None else value


def parse_body(payload: Any) -> AzureSearchBody:
    """The request body, or ``AzureError`` naming the parameter (Azure's camelCase)."""
    if not isinstance(payload, dict):
        raise AzureError("The request body must be a JSON object with search, vectorQueries, top, ...")
    try:
        return AzureSearchBody.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        if err["loc"] == ("skip",):
            msg = "paging is not supported by this backend: leave skip out (or 0) and raise top"
        elif err["loc"] == ("filter",):
            msg = "filters are not supported by this backend: leave filter out"
        elif err["type"] not in ("value_error", "missing"):
            msg += f" (got {err.get('input')!r})"
        raise AzureError(f"Invalid value for '{where}': {msg}") from exc


def hybrid_search(index: SearchIndex, cfg: Config, body: AzureSearchBody) -> dict[str, Any]:
    """The ``{"value": [...]}`` answer for ``body`` over ``index``; ``AzureError`` if
    the body names a field this index does not have."""
    dense_name, _ = cfg.dense_source()
    lists: list[tuple[np.ndarray, np.ndarray, float]] = []  # (docs best first, searchScores, weight)
    similarities: list[np.ndarray | None] = []
    text = None if body.search is None or body.search.strip() in ("", "*") else body.search
    if text is not None:
        bm25 = _bm25_name(index, cfg)
        scores = index.bm25[bm25].scores(analyze(text))
        docs = _best_first(scores, np.flatnonzero(scores > 0))[: body.hybrid_search.max_text_recall_size]
        lists.append((docs, scores[docs].astype(np.float64), 1.0))
        similarities.append(None)
    everyone = np.arange(len(index.docs.doc_ids))
    for i, vq in enumerate(body.vector_queries):
        fields = [f.strip() for f in vq.fields.split(",") if f.strip()]
        if fields != [dense_name]:
            raise AzureError(
                f"Invalid value for 'vectorQueries.{i}.fields': {vq.fields!r}: this index has one vector "
                f"field, {dense_name!r} (the dense source)"
            )
        cosines = (index.embedder.doc_vectors @ index.embedder.embed(vq.text)).astype(np.float64)
        docs = _best_first(cosines, everyone)[: vq.k]
        lists.append((docs, 1.0 / (2.0 - cosines[docs]), vq.weight))
        similarities.append(cosines[docs])
    if not lists:
        raise AzureError("The request needs a text query (search) or at least one vector query (vectorQueries)")
    fused: dict[int, float] = {}
    if len(lists) == 1:
        docs, scores, _ = lists[0]
        fused = dict(zip(docs.tolist(), scores.tolist(), strict=True))
    else:
        for docs, _, weight in lists:
            for rank, d in enumerate(docs.tolist(), 1):
                fused[d] = fused.get(d, 0.0) + weight / (RRF_CONSTANT + rank)
    order = sorted(fused, key=lambda d: (-fused[d], d))[: body.top]
    meta = index.docs
    value = []
    for d in order:
        hit: dict[str, Any] = {
            "@search.score": fused[d],
            "id": meta.doc_ids[d],
            "title": meta.titles[d],
            "date": meta.dates[d],
        }
        if body.debug != "disabled":
            hit["@search.documentDebugInfo"] = {"vectors": {"subscores": _subscores(d, lists, similarities, body)}}
        value.append(hit)
    return {"value": value}


def _subscores(
    doc: int,
    lists: list[tuple[np.ndarray, np.ndarray, float]],
    similarities: list[np.ndarray | None],
    body: AzureSearchBody,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    vectors: list[dict[str, Any]] = []
    for (docs, scores, _), sims in zip(lists, similarities, strict=True):
        at = np.flatnonzero(docs == doc)
        if sims is None:  # the text query
            if len(at):
                out["text"] = {"searchScore": float(scores[at[0]])}
            continue
        field = body.vector_queries[len(vectors)].fields.strip()
        vectors.append(
            {field: {"searchScore": float(scores[at[0]]), "vectorSimilarity": float(sims[at[0]])}} if len(at) else {}
        )
    if vectors:
        out["vectors"] = vectors
    out["documentBoost"] = 1.0
    return out


def _bm25_name(index: SearchIndex, cfg: Config) -> str:
    names = [n for n, s in cfg.enabled_sources().items() if isinstance(s, Bm25Source) and n in index.bm25]
    if not names:
        raise AzureError(
            "Invalid value for 'search': this index has no enabled BM25 source for the text query; "
            "send vectorQueries only, or enable a source of type: bm25",
        )
    return names[0]


def _best_first(scores: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """``docs`` by descending score, ties in corpus order."""
    return docs[np.argsort(-scores[docs], kind="stable")]
