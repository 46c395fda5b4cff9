"""Query sets: the JSONL file of queries a batch evaluation sends to the backend.

One JSON object per line::

    {"query_id": "q1", "query": "...", "query_type": "short", "source": "faq",
     "scope": "in", "split": "dev", "date_hint_days": 30}

``query_id``, ``query``, ``query_type``, ``source`` and ``scope`` are required;
``split`` is optional; every other key is an *extra request field* that the batch
evaluation passes into the search request body. A query set has a stable
``dataset_id`` (the file stem unless given, without a ``.queries`` suffix: the
importers write ``NAME.queries.jsonl``) and a ``content_hash`` over its
canonical content, so reformatting the file (key order, spacing, blank lines)
does not change the hash but any change of a value does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuner.errors import InputError

Scope = Literal["in", "oos"]
SCOPES: tuple[str, ...] = ("in", "oos")
REQUIRED_FIELDS: tuple[str, ...] = ("query_id", "query", "query_type", "source", "scope")
RESERVED_FIELDS: frozenset[str] = frozenset((*REQUIRED_FIELDS, "split"))


@dataclass(frozen=True, slots=True)
class Query:
    """One query of a query set; ``extra`` holds the fields passed into the request."""

    query_id: str
    query: str
    query_type: str
    source: str
    scope: Scope
    split: str | None = None
    # A plain dict (not a proxy) so queries pickle; hash=False keeps Query hashable.
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def in_scope(self) -> bool:
        return self.scope == "in"

    def record(self) -> dict[str, Any]:
        """The query as a flat record (the JSONL form), e.g. for request templates."""
        rec: dict[str, Any] = dict(self.extra)
        rec.update(
            query_id=self.query_id,
            query=self.query,
            query_type=self.query_type,
            source=self.source,
            scope=self.scope,
        )
        if self.split is not None:
            rec["split"] = self.split
        return rec


@dataclass(frozen=True, repr=False)
class QuerySet:
    """An ordered, immutable set of queries with a stable identity."""

    dataset_id: str
    content_hash: str
    queries: tuple[Query, ...]
    path: Path | None = None
    _by_id: Mapping[str, Query] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {q.query_id: q for q in self.queries})
        if len(self._by_id) != len(self.queries):
            raise InputError(
                f"query set {self.dataset_id!r}: query ids are not unique; give each query its own query_id"
            )

    def __repr__(self) -> str:
        return (
            f"QuerySet(dataset_id={self.dataset_id!r}, n={len(self.queries)}, content_hash={self.content_hash[:12]!r})"
        )

    def __len__(self) -> int:
        return len(self.queries)

    def __iter__(self) -> Iterator[Query]:
        return iter(self.queries)

    def __contains__(self, query_id: object) -> bool:
        return query_id in self._by_id

    def __getitem__(self, query_id: str) -> Query:
        return self.get(query_id)

    def get(self, query_id: str) -> Query:
        try:
            return self._by_id[query_id]
        except KeyError:
            raise KeyError(f"query set {self.dataset_id!r} has no query {query_id!r}") from None

    @property
    def query_ids(self) -> list[str]:
        return [q.query_id for q in self.queries]

    def in_scope(self) -> list[Query]:
        return [q for q in self.queries if q.scope == "in"]

    def oos(self) -> list[Query]:
        return [q for q in self.queries if q.scope == "oos"]

    def splits(self) -> list[str]:
        """The distinct split names, in order of first appearance."""
        return list(dict.fromkeys(q.split for q in self.queries if q.split is not None))

    def subset(self, *, split: str | None = None, query_ids: Iterable[str] | None = None) -> QuerySet:
        """A query set restricted to one split and/or given ids; keeps dataset id and hash
        (the subset is a view of the same dataset, and reports name the parent)."""
        wanted = None if query_ids is None else set(query_ids)
        if wanted is not None and (missing := wanted - self._by_id.keys()):
            raise KeyError(f"query set {self.dataset_id!r} has no queries {sorted(missing)[:5]}")
        kept = tuple(
            q for q in self.queries if (split is None or q.split == split) and (wanted is None or q.query_id in wanted)
        )
        return QuerySet(self.dataset_id, self.content_hash, kept, self.path)


def default_dataset_id(path: str | Path) -> str:
    """The dataset id a query file stands for: its stem, less a ``.queries`` suffix
    (``cranfield.queries.jsonl`` -> ``cranfield``), so datasets imported side by side
    get distinct ids without the user naming them."""
    stem = Path(path).stem
    return stem[: -len(".queries")] if stem.endswith(".queries") and stem != ".queries" else stem


def load_queryset(path: str | Path, dataset_id: str | None = None) -> QuerySet:
    """Read a JSONL query set; ``dataset_id`` defaults to ``default_dataset_id(path)``.

    Raises InputError (one line, ``file:line``) on malformed JSON, a missing or empty
    required field, a duplicate query id or an unknown scope.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{p}: query set file not found; pass an existing JSONL file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read query set ({exc}); pass a UTF-8 JSONL file") from exc
    return parse_queryset(text.splitlines(), name=str(p), dataset_id=dataset_id or default_dataset_id(p), path=p)


def parse_queryset(lines: Iterable[str], *, name: str, dataset_id: str, path: Path | None = None) -> QuerySet:
    """Parse JSONL lines (``name`` is used in error messages as ``name:line``)."""
    queries: list[Query] = []
    canonical: list[str] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        rec = _parse_line(line, where)
        query = _to_query(rec, where)
        if query.query_id in first_line:
            raise InputError(
                f"{where}: duplicate query_id {query.query_id!r} (first at line "
                f"{first_line[query.query_id]}); give each query a unique query_id"
            )
        first_line[query.query_id] = lineno
        queries.append(query)
        canonical.append(json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    if not queries:
        raise InputError(f"{name}: query set is empty; add one JSON object per line")
    digest = hashlib.sha256("\n".join(canonical).encode("utf-8")).hexdigest()
    return QuerySet(dataset_id, digest, tuple(queries), path)


def _parse_line(line: str, where: str) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where}: malformed JSON ({exc.msg} at column {exc.colno}); write one JSON object per line"
        ) from exc
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}; write one object per line")
    return rec


def _to_query(rec: dict[str, Any], where: str) -> Query:
    missing = [k for k in REQUIRED_FIELDS if k not in rec]
    if missing:
        raise InputError(f"{where}: missing field {', '.join(missing)}; every query needs {', '.join(REQUIRED_FIELDS)}")
    qid = rec["query_id"]
    # JSON numbers are accepted as ids because qrels files number queries; labels key on strings.
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise InputError(f"{where}: query_id must be a non-empty string, got {qid!r}")
    qid = str(qid)
    text = rec["query"]
    if not isinstance(text, str) or not text.strip():
        raise InputError(
            f"{where}: empty query text for query {qid}; give the query a non-empty 'query' string or remove it"
        )
    for key in ("query_type", "source"):
        if not isinstance(rec[key], str) or not rec[key].strip():
            raise InputError(f"{where}: {key} of query {qid} must be a non-empty string, got {rec[key]!r}")
    scope = rec["scope"]
    if scope not in SCOPES:
        raise InputError(f"{where}: unknown scope {scope!r} for query {qid}; use 'in' or 'oos'")
    split = rec.get("split")
    if split is not None and not isinstance(split, str):
        raise InputError(f"{where}: split of query {qid} must be a string or absent, got {split!r}")
    extra = {k: v for k, v in rec.items() if k not in RESERVED_FIELDS}
    return Query(
        query_id=qid,
        query=text,
        query_type=rec["query_type"],
        source=rec["source"],
        scope=scope,
        split=split,
        extra=extra,
    )


UNJUDGED_POLICIES: tuple[str, ...] = ("drop", "keep", "error")


@dataclass(frozen=True)
class JudgedSubset:
    """A query set with the unjudged-queries policy applied, and what it did."""

    queries: QuerySet
    unjudged: tuple[str, ...]  # in-scope query ids without a single judgment
    policy: str
    n_in_scope: int  # in-scope queries before the policy

    @property
    def note(self) -> str | None:
        """One line for the console and the reports, None when every query is judged."""
        n, total = len(self.unjudged), self.n_in_scope
        if not n:
            return None
        first = ", ".join(self.unjudged[:3])
        if self.policy == "drop":
            return (
                f"dropped {n} of {total} in-scope queries that have no judgments at all (first: {first}); "
                "they would score 0 whatever the config (dataset.unjudged_queries: drop)"
            )
        return (
            f"kept {n} in-scope queries that have no judgments at all (first: {first}): each scores 0 "
            "whatever the config (dataset.unjudged_queries: keep); judge them or set drop"
        )


def judged_subset(queries: QuerySet, judged_ids: Iterable[str], policy: str = "drop") -> JudgedSubset:
    """Apply the unjudged-queries policy: in-scope queries without any judgment are
    dropped (``drop``), kept and scored 0 (``keep``), or refused (``error``). OOS
    queries need no judgments and are always kept."""
    if policy not in UNJUDGED_POLICIES:
        raise InputError(f"unjudged queries policy {policy!r}: use one of {', '.join(UNJUDGED_POLICIES)}")
    judged = set(judged_ids)
    n_in_scope = len(queries.in_scope())
    unjudged = tuple(q.query_id for q in queries if q.scope == "in" and q.query_id not in judged)
    if unjudged and policy == "error":
        raise InputError(
            f"query set {queries.dataset_id!r}: {len(unjudged)} of {len(queries.in_scope())} in-scope queries have no "
            f"judgments (first: {', '.join(unjudged[:3])}); judge them, or set dataset.unjudged_queries: drop"
        )
    if unjudged and policy == "drop":
        skip = set(unjudged)
        queries = queries.subset(query_ids=[q.query_id for q in queries if q.query_id not in skip])
    return JudgedSubset(queries, unjudged, policy, n_in_scope)
