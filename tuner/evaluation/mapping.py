"""Request and response mapping: pure translation between query records and JSON.

The request side fills the body template of a ``RequestMapping`` from a ``Query``;
the response side pulls results, doc ids, scores, titles, confidence, handoff and
fallback level out of a JSON response by dotted paths (``data.hits``; a numeric
segment indexes a list: ``data.0.hits``; ``@search\\.score`` is one key holding a dot:
tuner.evaluation.paths). A results list longer than ``top_k`` is cut
to its first ``top_k`` hits (the rest are counted, never parsed nor kept): a backend
that ignores ``top_k`` can neither change the score nor blow up memory and reports.

A document listed twice in one answer counts once, at its first place: after the cut
to ``top_k``, every later copy is removed (and counted in ``repeats``) before ranks are
assigned, so the hits after it move up. Scored, reported and exported, a live answer is
then the same as the run file of its list without the repeats, which ``tuner score``
reads (it refuses a run that lists a document twice, as trec_eval does). The rule is
applied where a ``ParsedResponse`` is made, so both answer decoders
(tuner.evaluation.answers' typed one and ``parse_response``) and every other maker of
one give the same hits.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import msgspec
import orjson

from tuner.data.dataset import Query
from tuner.errors import ConfigError, ResponseMappingError
from tuner.evaluation.paths import is_plain_key, single_key, split_path
from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

_PLACEHOLDER = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_MISSING = object()
_DOC_ID = attrgetter("doc_id")


class Hit(msgspec.Struct, frozen=True, gc=False):
    """One result of a response, in the order the service returned it.

    A msgspec struct, so the typed answer decoder (tuner.evaluation.answers) builds the
    hits of an answer whose fields are named doc_id / score / title straight from its
    bytes (msgspec refuses a number that overflows a double, such as 1e999: that answer
    then goes through parse_response, which names it)."""

    doc_id: str
    score: float | None = None
    title: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """What a batch evaluation needs from one response."""

    hits: tuple[Hit, ...]
    confidence: float | None = None
    handoff: bool | None = None
    fallback_level: str | None = None
    handoff_reason: str | None = None
    #: hits the service returned beyond ``top_k``, cut off unparsed (0 when it kept to top_k)
    truncated: int = 0
    #: later copies of a document listed above them in the answer, removed (``first_occurrences``)
    repeats: int = 0

    def __post_init__(self) -> None:
        # The one place the rule is applied: every answer, however it was decoded or built
        # (the typed decoder, parse_response, a replay, a test), holds each document once.
        hits, removed = first_occurrences(self.hits)
        if removed or type(self.hits) is not tuple:
            object.__setattr__(self, "hits", hits)
        if removed:
            object.__setattr__(self, "repeats", self.repeats + removed)


def first_occurrences(hits: Sequence[Hit]) -> tuple[tuple[Hit, ...], int]:
    """``hits`` with every later copy of a document removed (the first keeps its place;
    the hits after a removed copy move up), and how many were removed."""
    hits = tuple(hits)
    n = len(hits)
    if n < 2:
        return hits, 0
    if len(set(map(_DOC_ID, hits))) == n:  # the common case, on the event loop per answer: no copy
        return hits, 0
    seen: set[str] = set()
    add = seen.add
    kept = tuple(h for h in hits if not (h.doc_id in seen or add(h.doc_id)))
    return kept, n - len(kept)


# --------------------------------------------------------------------------- request


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready to send: everything the HTTP layer needs, nothing more."""

    query_id: str
    request_id: str
    method: str
    url: str
    headers: Mapping[str, str]
    json: Any = None
    params: Mapping[str, Any] | None = None
    #: ``json`` encoded, with a Content-Type among ``headers`` (RequestTemplates); None: encoded when sent
    body: bytes | None = None


def prepare_request(spec: EvalSpec, query: Query, request_id: str) -> PreparedRequest:
    """The request for one query (ConfigError when the body template does not fit it)."""
    req = spec.request
    body = build_body(req, query, spec.top_k)
    headers = {**req.headers, req.request_id_header: request_id}
    if req.method == "GET":
        return PreparedRequest(query.query_id, request_id, "GET", req.url, headers, params=build_params(body))
    return PreparedRequest(query.query_id, request_id, req.method, req.url, headers, json=body)


def encode_json(value: Any) -> bytes:
    """A request body as JSON bytes: orjson, or the standard library for what orjson
    refuses (an int past 64 bits, a non-str key)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class RequestTemplates:
    """Every query's request built once: the body template filled and encoded. A study
    sends the same requests every trial; ``for_batch`` gives them with fresh request
    ids, the only part that changes (rebuilding them cost 3 ms of every trial's path).
    ConfigError as ``prepare_request`` when a template does not fit a query."""

    def __init__(self, spec: EvalSpec, queries: Iterable[Query]) -> None:
        self.spec = spec
        self._built: dict[str, PreparedRequest] = {}
        for q in queries:
            req = prepare_request(spec, q, "")
            if req.json is not None:
                headers = dict(req.headers)
                if not any(k.lower() == "content-type" for k in headers):
                    headers["Content-Type"] = "application/json"
                req = replace(req, headers=headers, body=encode_json(req.json))
            self._built[q.query_id] = req

    def for_batch(self, order: Sequence[Query]) -> list[PreparedRequest]:
        name = self.spec.request.request_id_header
        out = []
        for q in order:
            req = self._built[q.query_id]
            rid = str(uuid.uuid4())
            out.append(replace(req, request_id=rid, headers={**req.headers, name: rid}))
        return out


def template_values(query: Query, top_k: int) -> dict[str, Any]:
    """The names a body template may reference: the query record plus ``top_k``."""
    values = query.record()
    values["top_k"] = top_k
    return values


def build_body(mapping: RequestMapping, query: Query, top_k: int) -> dict[str, Any]:
    """Fill the body template; a string that is exactly ``"{name}"`` becomes the typed
    value (``top_k`` stays an int), other strings are ``str.format``-ed. With
    ``pass_extra`` the query's extra fields are merged in and win over template
    defaults, because they are the more specific, per-query values."""
    values = template_values(query, top_k)
    body = _fill(mapping.body, values, query.query_id, ("body",))
    if mapping.pass_extra:
        body.update(query.extra)
    return body


_SCALARS = frozenset({int, float, bool, type(None)})


def _fill(node: Any, values: Mapping[str, Any], qid: str, where: tuple[Any, ...]) -> Any:
    # Every query's body of every trial passes here (channel: request: a new template per
    # trial's values), so the common cases go first and cheap: plain dicts, lists, numbers and
    # strings without braces (nothing to format: format_map would return them equal), and
    # the error's path (``where``) is spelled out only when an error is raised.
    kind = type(node)
    if kind is str:
        if "{" not in node and "}" not in node:
            return node
    elif kind is dict:
        return {k: _fill(v, values, qid, (*where, k)) for k, v in node.items()}
    elif kind is list:
        return [_fill(v, values, qid, (*where, (i,))) for i, v in enumerate(node)]
    elif kind in _SCALARS:
        return node
    if isinstance(node, str):
        exact = _PLACEHOLDER.match(node)
        if exact:
            name = exact.group(1)
            if name not in values:
                raise ConfigError(_unknown_name(name, values, qid, _spelled(where)))
            return values[name]
        try:
            return node.format_map(values)
        except KeyError as exc:
            raise ConfigError(_unknown_name(str(exc.args[0]), values, qid, _spelled(where))) from exc
        except (ValueError, IndexError) as exc:
            raise ConfigError(
                f"request.{_spelled(where)}: bad template {node!r} ({exc}); write literal braces as {{{{ and }}}}"
            ) from exc
    if isinstance(node, Mapping):
        return {k: _fill(v, values, qid, (*where, k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values, qid, (*where, (i,))) for i, v in enumerate(node)]
    return node


def _spelled(where: tuple[Any, ...]) -> str:
    """A template's path as its errors name it, ``body.filters.tags[1]``: a key is
    ``.key``, a list index the 1-tuple ``(i,)``."""
    return "".join(
        f"[{part[0]}]" if isinstance(part, tuple) else (str(part) if i == 0 else f".{part}")
        for i, part in enumerate(where)
    )


def _unknown_name(name: str, values: Mapping[str, Any], qid: str, where: str) -> str:
    return (
        f"request.{where}: template references {{{name}}} but query {qid} has no field {name!r} "
        f"(available: {', '.join(sorted(values))}); add it to every query or fix the template"
    )


def build_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """For GET requests the filled body becomes the query string; nested values are
    sent as JSON text since a URL has no structure."""
    return {
        k: json.dumps(v) if isinstance(v, (dict, list)) else ("true" if v is True else "false" if v is False else v)
        for k, v in body.items()
        if v is not None
    }


# --------------------------------------------------------------------------- response


def resolve_path(payload: Any, path: str) -> Any:
    """Follow a dotted path (escapes as tuner.evaluation.paths); returns the module
    sentinel ``_MISSING`` when absent."""
    if type(payload) is dict and is_plain_key(path):  # the common case, once per field per hit
        return payload.get(path, _MISSING)
    node = payload
    for seg in split_path(path):
        if isinstance(node, Mapping):
            node = node.get(seg, _MISSING)
        elif isinstance(node, list) and seg.lstrip("-").isdigit():
            idx = int(seg)
            node = node[idx] if -len(node) <= idx < len(node) else _MISSING
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def decode_json(content: bytes, query_id: str, content_type: str | None = None) -> Any:
    """Decode a response body; ResponseMappingError naming the query when it is not JSON.

    orjson decodes a search answer about 4x faster than the standard library (once per
    query of every batch, on the event loop); what it refuses goes through ``json.loads``,
    which also reads NaN / Infinity (then named by the mapping as not finite) and gives
    the error message."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        snippet = content[:60].decode("utf-8", "replace").replace("\n", " ")
        kind = f" ({content_type})" if content_type else ""
        raise ResponseMappingError(
            f"query {query_id}: response is not JSON{kind}: {snippet!r}; "
            "point --url / request.url at the search endpoint that returns JSON"
        ) from exc


def parse_response(
    payload: Any, mapping: ResponseMapping, query_id: str, *, top_k: int | None = None
) -> ParsedResponse:
    """Extract hits and signals from a decoded JSON response; with ``top_k``, only the
    first ``top_k`` results are parsed and the rest counted in ``truncated``."""
    results = resolve_path(payload, mapping.results_path)
    if results is _MISSING:
        keys = ", ".join(sorted(payload)) if isinstance(payload, Mapping) else type(payload).__name__
        raise ResponseMappingError(
            f"query {query_id}: response has no {mapping.results_path!r} (top-level keys: {keys}); "
            "set response.results_path to the path of the results list"
        )
    if results is None:
        results = []
    if not isinstance(results, list):
        raise ResponseMappingError(
            f"query {query_id}: {mapping.results_path!r} is a {type(results).__name__}, not a list; "
            "set response.results_path to the results list"
        )
    truncated = 0
    if top_k is not None and len(results) > top_k:
        truncated = len(results) - top_k
        results = results[:top_k]
    return ParsedResponse(
        hits=_hits(results, mapping, query_id),
        confidence=_number(payload, mapping.confidence, query_id),
        handoff=_flag(payload, mapping.handoff, query_id),
        fallback_level=_label(payload, mapping.fallback_level),
        handoff_reason=_label(payload, mapping.handoff_reason),
        truncated=truncated,
    )


def _hits(results: list[Any], mapping: ResponseMapping, qid: str) -> tuple[Hit, ...]:
    """Every hit of a results list. Parsing runs once per hit of every response, on the
    event loop that also sends the requests, so the common shape (flat keys, a string
    id, a float score) takes an inlined path; anything else goes through ``_hit``,
    which holds the rules and the error messages."""
    # a path of one key (an escaped dot inside it included: '@search\\.score') is read by that key
    doc_key = single_key(mapping.doc_id)
    score_key = None if mapping.score is None else single_key(mapping.score)
    title_key = None if mapping.title is None else single_key(mapping.title)
    nested = (mapping.score is not None and score_key is None) or (mapping.title is not None and title_key is None)
    if doc_key is None or nested:
        return tuple(_hit(item, i, mapping, qid) for i, item in enumerate(results))
    out: list[Hit] = []
    append, isfinite = out.append, math.isfinite
    for i, item in enumerate(results):
        if type(item) is dict:
            doc = item.get(doc_key)
            score = None if score_key is None else item.get(score_key)
            title = None if title_key is None else item.get(title_key)
            if (
                type(doc) is str
                and (score is None or (type(score) is float and isfinite(score)))
                and (title is None or type(title) is str)
            ):
                append(Hit(doc, score, title))
                continue
        append(_hit(item, i, mapping, qid))
    return tuple(out)


def _hit(item: Any, index: int, mapping: ResponseMapping, qid: str) -> Hit:
    where = f"{mapping.results_path}[{index}]"
    doc = resolve_path(item, mapping.doc_id)
    if doc is _MISSING or doc is None or isinstance(doc, bool) or not isinstance(doc, (str, int)):
        raise ResponseMappingError(
            f"query {qid}: {where} has no usable {mapping.doc_id!r} (got {_short(item)}); set response.doc_id"
        )
    score = _number(item, mapping.score, qid, where)
    title = None if mapping.title is None else resolve_path(item, mapping.title)
    return Hit(str(doc), score, None if title is _MISSING or title is None else str(title))


def _number(node: Any, path: str | None, qid: str, where: str = "response") -> float | None:
    if path is None:
        return None
    value = resolve_path(node, path)
    if value is _MISSING or value is None:
        return None
    if isinstance(value, str):  # a number sent as text (Weaviate's GraphQL _additional.score: "0.8")
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ResponseMappingError(
            f"query {qid}: {where}.{path} = {value!r} is not a finite number; fix the mapping path"
        )
    return float(value)


def _flag(node: Any, path: str | None, qid: str) -> bool | None:
    if path is None:
        return None
    value = resolve_path(node, path)
    if value is _MISSING or value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ResponseMappingError(
        f"query {qid}: response.{path} = {value!r} is not a boolean; point response.handoff at a true/false field"
    )


def _label(node: Any, path: str | None) -> str | None:
    if path is None:
        return None
    value = resolve_path(node, path)
    return None if value is _MISSING or value is None else str(value)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
