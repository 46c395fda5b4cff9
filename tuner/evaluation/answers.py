"""Answer decoding: a search answer's bytes straight to a ParsedResponse, reading only
the fields the response mapping names.

Every answer of every trial is decoded on the event loop that also sends the requests,
so its cost is tuner time on the backend's path. ``orjson.loads`` builds the whole
answer as Python objects (on the demo: titles, dates, sub-scores and ranks of 50 hits,
11 KB) and ``parse_response`` then walks it; a msgspec decoder typed by the mapping
skips what the mapping does not read and builds the ``Hit`` structs in C: 20 ms ->
6 ms for the demo's 294 answers.

The typed decoder is a fast path, never a second set of rules. It is built only for
mappings it can express exactly (dotted paths without list indexes, no field read
twice; a key holding an escaped dot, ``@search\\.score``, is one key, as
tuner.evaluation.paths reads it), and its types are the narrow common shape: a string
doc id, a finite number or null as the score, a string title, a boolean handoff, string labels. Anything else in
an answer (an integer id, ``"true"`` as a handoff, a missing field that must be there,
text that is not JSON) fails the typed decode, and that answer goes through
``decode_json`` + ``parse_response``, which hold the rules and the error messages.
Both paths give equal ParsedResponses (tests/evaluation/test_answers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from tuner.evaluation.mapping import Hit, ParsedResponse, decode_json, parse_response
from tuner.evaluation.paths import split_path
from tuner.evaluation.spec import ResponseMapping

_HIT_FIELDS = ("doc_id", "score", "title")
_TOP_FIELDS = ("confidence", "handoff", "fallback_level", "handoff_reason")
# msgspec refuses a number that overflows a double (1e999), as parse_response does (not finite)
_LEAF_TYPES: dict[str, Any] = {
    "doc_id": str,
    "score": float | None,
    "title": str | None,
    "confidence": float | None,
    "handoff": bool | None,
    "fallback_level": str | None,
    "handoff_reason": str | None,
}
_FAILED = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError)  # all found by the tests


class AnswerDecoder:
    """``parse(content, query_id, content_type)``: the ParsedResponse of one answer, as
    ``parse_response(decode_json(...))`` gives it, with the same errors
    (ResponseMappingError); ``typed`` says whether the mapping has the fast path."""

    def __init__(self, mapping: ResponseMapping, top_k: int | None) -> None:
        self.mapping = mapping
        self.top_k = top_k
        built = _typed(mapping, top_k)
        self._decoder: msgspec.json.Decoder[Any] | None = None if built is None else msgspec.json.Decoder(built[0])
        self._read: Callable[[Any], ParsedResponse] | None = None if built is None else built[1]

    @property
    def typed(self) -> bool:
        return self._decoder is not None

    def parse(self, content: bytes, query_id: str, content_type: str | None = None) -> ParsedResponse:
        if self._decoder is not None and self._read is not None:
            try:
                return self._read(self._decoder.decode(content))
            except _FAILED:
                pass  # not the common shape: the general path decides, and names what is wrong
        return parse_response(decode_json(content, query_id, content_type), self.mapping, query_id, top_k=self.top_k)


# --------------------------------------------------------------------------- building


def _absent(_node: Any) -> Any:
    """The getter of a hit field the mapping does not name."""
    return None


def _typed(mapping: ResponseMapping, top_k: int | None) -> tuple[type, Callable[[Any], ParsedResponse]] | None:
    """The answer's struct type and the function reading a decoded answer, or None when
    the mapping needs the general path."""
    hit_paths = {name: path for name in _HIT_FIELDS if (path := getattr(mapping, name)) is not None}
    top_paths = {name: path for name in _TOP_FIELDS if (path := getattr(mapping, name)) is not None}
    every = [mapping.results_path, *hit_paths.values(), *top_paths.values()]
    if any(not seg or seg.lstrip("-").isdigit() for path in every for seg in split_path(path)):
        return None  # a list index (or an empty segment): resolve_path's rules, not a struct's
    hit_tree = _tree(hit_paths)
    top_tree = _tree({**top_paths, "results": mapping.results_path})
    if hit_tree is None or top_tree is None:
        return None  # one path inside another, or one field read twice
    direct = hit_paths == {name: name for name in _HIT_FIELDS}  # the answer's hits are Hit structs as they are
    hit_type = Hit if direct else _struct("MappedHit", hit_tree, {"doc_id": str})
    top_type = _struct("Answer", top_tree, {"results": list[hit_type] | None})  # type: ignore[valid-type]  # built at run time
    get_results = _getter(top_tree, "results")
    get_top = [(name, _getter(top_tree, name)) for name in top_paths]
    get_doc, get_score, get_title = (_getter(hit_tree, name) if name in hit_paths else _absent for name in _HIT_FIELDS)

    def read(answer: Any) -> ParsedResponse:
        hits = get_results(answer) or ()
        truncated = 0
        if top_k is not None and len(hits) > top_k:
            truncated = len(hits) - top_k
            hits = hits[:top_k]
        if not direct:
            hits = [Hit(get_doc(h), get_score(h), get_title(h)) for h in hits]
        return ParsedResponse(hits=tuple(hits), truncated=truncated, **{name: get(answer) for name, get in get_top})

    return top_type, read


def _tree(paths: dict[str, str]) -> dict[str, Any] | None:
    """Dotted paths as nested dicts whose leaves are the field names; None when a path
    lies inside another or two fields share one."""
    root: dict[str, Any] = {}
    for name, path in paths.items():
        node = root
        *inner, last = split_path(path)  # '@search\\.score' is the one key '@search.score'
        for seg in inner:
            node = node.setdefault(seg, {})
            if not isinstance(node, dict):
                return None
        if last in node:
            return None
        node[last] = name
    return root


def _struct(name: str, tree: dict[str, Any], required: dict[str, Any]) -> type:
    """A struct reading ``tree``'s keys: a leaf field as its type (``required`` ones
    with no default, the rest null when absent), an inner node as a struct of its own,
    required when a required field lies below it, else null when absent or null."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    for i, (key, node) in enumerate(tree.items()):
        attr = f"f{i}"
        rename[attr] = key
        if isinstance(node, dict):
            inner = _struct(f"{name}_{i}", node, required)
            fields.append((attr, inner) if _holds(node, required) else (attr, inner | None, None))
        elif node in required:
            fields.append((attr, required[node]))
        else:
            fields.append((attr, _LEAF_TYPES[node], None))
    fields.sort(key=lambda f: len(f) == 3)  # fields without a default first
    return msgspec.defstruct(name, fields, rename=rename, gc=False, module=__name__)


def _holds(tree: dict[str, Any], required: dict[str, Any]) -> bool:
    return any(_holds(n, required) if isinstance(n, dict) else n in required for n in tree.values())


def _getter(tree: dict[str, Any], field: str) -> Callable[[Any], Any]:
    """Reads ``field`` off a decoded struct of ``tree``: its value, or None when an
    optional node on the way was absent or null."""
    attrs = _attrs(tree, field)
    if attrs is None:
        raise AssertionError(f"{field} is not in the tree")
    if len(attrs) == 1:
        (only,) = attrs
        return lambda node: getattr(node, only)

    def get(node: Any) -> Any:
        for attr in attrs:
            if node is None:
                return None
            node = getattr(node, attr)
        return node

    return get


def _attrs(tree: dict[str, Any], field: str) -> list[str] | None:
    for i, node in enumerate(tree.values()):
        if node == field:
            return [f"f{i}"]
        if isinstance(node, dict) and (below := _attrs(node, field)) is not None:
            return [f"f{i}", *below]
    return None
