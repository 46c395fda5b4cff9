"""Trial values carried in the search request itself (issue 28's request channel): a pure
translation between a search space's config keys and places in the declared request.

Most hybrid engines take fusion parameters per request (Azure AI Search's
``vectorQueries[i].weight``, Elasticsearch's ``rrf.rank_constant``, OpenSearch's inline
``search_pipeline`` weights, Qdrant's ``prefetch`` limits): there the tuner patches no
file and restarts nothing; each trial's requests carry its values. A binding names, for
each config key, one place of the request ``evaluation.request`` declares:

    body.<dotted path>    a value in the JSON body template; a numeric segment indexes a
                          list (``body.vectorQueries.1.weight``)
    query.<name>          a query-string parameter of the URL
    header.<name>         a request header

The request as declared is production as found: ``declared`` reads each bound place's
value there (the baseline trial's values; a place the request does not declare is an
error, never a silent default), ``render`` gives the request with a trial's values in
their places (the rest of the request untouched: the query placeholders are filled per
query later, tuner.evaluation.mapping), and ``fragment`` is what ``tuner apply`` shows a
user whose application builds the request. A value read from the URL or a header is
text; ``declared`` turns it into the type of the value it stands for when the caller
says which (``as_type``).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tuner.errors import ConfigError
from tuner.evaluation.spec import RequestMapping

Where = Literal["body", "query", "header"]
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class Place:
    """One place of a request: ``where`` and the path in it (one name for query / header)."""

    where: Where
    path: tuple[str | int, ...]

    def __str__(self) -> str:
        return ".".join([self.where, *map(str, self.path)])


def parse_place(text: str, key: str = "?") -> Place:
    """``body.a.0.b`` / ``query.k`` / ``header.X-Weight`` -> a Place (ConfigError naming
    ``key``, the config key it binds, when it is none of them)."""
    head, _, rest = text.partition(".")
    if head not in ("body", "query", "header") or not rest or any(not s for s in rest.split(".")):
        raise ConfigError(
            f"target.request.bind.{key}: {text!r} is not a place in the request; write body.<dotted path> "
            "(body.vectorQueries.1.weight), query.<parameter> (query.k) or header.<name> (header.X-Weight)"
        )
    if head == "body":
        path: tuple[str | int, ...] = tuple(int(s) if _INDEX.match(s) else s for s in rest.split("."))
        return Place("body", path)
    return Place("query" if head == "query" else "header", (rest,))


@dataclass(frozen=True)
class RequestBinding:
    """Config key -> its place in the declared request (module doc)."""

    places: Mapping[str, Place]

    @classmethod
    def parse(cls, bind: Mapping[str, str]) -> RequestBinding:
        """From ``target.request.bind`` (config key -> place text); two keys on one place
        are refused (one value would silently win)."""
        places = {key: parse_place(text, key) for key, text in bind.items()}
        seen: dict[Place, str] = {}
        for key, place in places.items():
            if place in seen:
                raise ConfigError(
                    f"target.request.bind: {seen[place]} and {key} are both bound to {place}; "
                    "give each config key its own place"
                )
            seen[place] = key
        return cls(places)

    def declared(self, request: RequestMapping, as_type: Callable[[str, str], Any] | None = None) -> dict[str, Any]:
        """Each bound key's value in the request as declared (the baseline). A value in
        the URL or a header is text; ``as_type(key, text)``, when given, converts it."""
        values: dict[str, Any] = {}
        for key, place in self.places.items():
            raw = _read(request, place, key)
            values[key] = (
                as_type(key, raw) if as_type is not None and isinstance(raw, str) and place.where != "body" else raw
            )
        return values

    def render(self, request: RequestMapping, values: Mapping[str, Any]) -> RequestMapping:
        """``request`` with each bound key of ``values`` in its place (keys not in
        ``values`` keep the declared value; a key in ``values`` that is not bound is an
        error: it would be tuned and never sent)."""
        unbound = sorted(set(values) - set(self.places))
        if unbound:
            raise ConfigError(
                f"target.request.bind has no place for {', '.join(unbound)}: every key the search space "
                "tunes must be bound to a place in the request (add target.request.bind.<key>: body.<path>)"
            )
        body = copy.deepcopy(request.body)
        split = urlsplit(request.url)
        params = dict(parse_qsl(split.query, keep_blank_values=True))
        headers = dict(request.headers)
        for key, value in values.items():
            place = self.places[key]
            _read(request, place, key)  # the place must be declared: a typo never adds a new field
            if place.where == "body":
                _set(body, place.path, _json_value(value, key), key)
            elif place.where == "query":
                params[str(place.path[0])] = _text(value)
            else:
                headers[_header_name(headers, str(place.path[0]))] = _text(value)
        url = urlunsplit(split._replace(query=urlencode(params))) if params or split.query else request.url
        return request.model_copy(update={"body": body, "url": url, "headers": headers})

    def fragment(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The part of a request that carries ``values``, nested as the request nests it
        (what `tuner apply` prints when no file holds them): ``{"body": {...}, "query":
        {...}, "headers": {...}}`` with only the parts that bind something."""
        out: dict[str, Any] = {}
        for key, value in values.items():
            place = self.places.get(key)
            if place is None:
                continue
            if place.where == "body":
                node = out.setdefault("body", {})
                for seg in place.path[:-1]:
                    node = node.setdefault(str(seg), {})
                node[str(place.path[-1])] = _json_value(value, key)
            else:
                out.setdefault("query" if place.where == "query" else "headers", {})[str(place.path[0])] = _text(value)
        return out


def _read(request: RequestMapping, place: Place, key: str) -> Any:
    if place.where == "body":
        node: Any = request.body
        for i, seg in enumerate(place.path):
            where = "body." + ".".join(map(str, place.path[: i + 1]))
            if isinstance(seg, int):
                if not isinstance(node, list) or seg >= len(node):
                    have = f"a list of {len(node)}" if isinstance(node, list) else type(node).__name__
                    raise _not_declared(key, place, f"{where} is not in it ({have} there)")
            elif not isinstance(node, Mapping) or seg not in node:
                raise _not_declared(key, place, f"{where} is not in it")
            node = node[seg]
        if isinstance(node, (Mapping, list)):
            raise ConfigError(
                f"target.request.bind.{key}: {place} holds a {'list' if isinstance(node, list) else 'mapping'} "
                "in evaluation.request.body; bind a single value (one level deeper)"
            )
        if isinstance(node, str) and _PLACEHOLDER.search(node):
            raise ConfigError(
                f"target.request.bind.{key}: {place} is {node!r}, a placeholder the tuner fills per query; "
                "bind a place that holds the production value"
            )
        return node
    name = str(place.path[0])
    if place.where == "query":
        params = dict(parse_qsl(urlsplit(request.url).query, keep_blank_values=True))
        if name not in params:
            raise _not_declared(key, place, f"the URL {request.url!r} has no query parameter {name!r}")
        return params[name]
    header = _header_name(request.headers, name)
    if header not in request.headers:
        raise _not_declared(key, place, f"evaluation.request.headers has no {name!r}")
    return request.headers[header]


def _not_declared(key: str, place: Place, why: str) -> ConfigError:
    return ConfigError(
        f"target.request.bind.{key}: {place} is not declared in evaluation.request ({why}); "
        "declare it there with the production value: the request as declared is the baseline"
    )


def _set(body: Any, path: tuple[str | int, ...], value: Any, key: str) -> None:
    node = body
    for seg in path[:-1]:
        node = node[seg]
    node[path[-1]] = value


def _json_value(value: Any, key: str) -> Any:
    """A value as JSON carries it: numpy scalars as Python numbers; NaN / inf refused."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value} cannot be sent in a JSON request; bound the search space")
    return value


def _text(value: Any) -> str:
    """A value in a URL or a header: JSON's spelling for booleans and numbers."""
    value = _json_value(value, "?")
    return value if isinstance(value, str) else json.dumps(value)


def _header_name(headers: Mapping[str, str], name: str) -> str:
    """The declared header's own spelling of ``name`` (header names ignore case)."""
    return next((h for h in headers if h.lower() == name.lower()), name)
