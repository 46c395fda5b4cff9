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
    body.<path>#<name>    the value written ``<name>: <value>`` inside the text at
                          body.<path>: a hybrid argument in a GraphQL query string
                          (Weaviate's ``hybrid: {alpha: 0.5, fusionType: rankedFusion}``),
                          a number or a bare word (an enum value), found exactly once

The request as declared is production as found: ``declared`` reads each bound place's
value there (the baseline trial's values; a place the request does not declare is an
error, never a silent default), ``render`` gives the request with a trial's values in
their places (the rest of the request untouched: the query placeholders are filled per
query later, tuner.evaluation.mapping), and ``fragment`` is what ``tuner apply`` shows a
user whose application builds the request. A value read from the URL or a header is
text; ``declared`` turns it into the type of the value it stands for when the caller
says which (``as_type``).

A value inside a text is read back from the text as declared (a JSON number, ``true`` /
``false``, or a bare word), so the baseline is still what production sends; the text must
hold ``<name>:`` followed by such a value exactly once (none: not declared; twice: which
one is meant is ambiguous; both refused when the experiment loads). A trial's value is
written as the same kind of token (a number, or a word of letters, digits and ``_``): it
never needs quoting or escaping, and a value that would (a quoted string, NaN) is refused.
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
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_TOKEN = rf"(?:{_NUMBER}|[A-Za-z_][A-Za-z0-9_]*)"


@dataclass(frozen=True)
class Place:
    """One place of a request: ``where`` and the path in it (one name for query / header)."""

    where: Where
    path: tuple[str | int, ...]
    #: the argument written ``arg: value`` inside the text at ``path`` (body only); None: the whole value
    arg: str | None = None

    def __str__(self) -> str:
        return ".".join([self.where, *map(str, self.path)]) + (f"#{self.arg}" if self.arg else "")


def parse_place(text: str, key: str = "?") -> Place:
    """``body.a.0.b`` / ``body.query#alpha`` / ``query.k`` / ``header.X-Weight`` -> a
    Place (ConfigError naming ``key``, the config key it binds, when it is none of them)."""
    head, _, rest = text.partition(".")
    rest, hash_, arg = rest.partition("#") if head == "body" else (rest, "", "")
    if (
        head not in ("body", "query", "header")
        or not rest
        or any(not s for s in rest.split("."))
        or (hash_ and not _NAME.match(arg))
    ):
        raise ConfigError(
            f"target.request.bind.{key}: {text!r} is not a place in the request; write body.<dotted path> "
            "(body.vectorQueries.1.weight), body.<path>#<argument> for a value written 'argument: value' "
            "inside a text (body.query#alpha), query.<parameter> (query.k) or header.<name> (header.X-Weight)"
        )
    if head == "body":
        path: tuple[str | int, ...] = tuple(int(s) if _INDEX.match(s) else s for s in rest.split("."))
        return Place("body", path, arg or None)
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
            if place.arg is not None:
                _set(body, place.path, _write_arg(_get(body, place.path), place, value, key), key)
            elif place.where == "body":
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
                if place.arg is not None:  # {"query": {"alpha": 0.7}}: write alpha: 0.7 in body.query's text
                    node.setdefault(str(place.path[-1]), {})[place.arg] = _json_value(value, key)
                else:
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
        if place.arg is not None:
            return _read_arg(node, place, key)
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


def _arg_matches(text: Any, place: Place, key: str) -> list[re.Match[str]]:
    """Where ``<arg>: <token>`` is written in the text at ``place`` (exactly once, else ConfigError)."""
    if not isinstance(text, str):
        raise ConfigError(
            f"target.request.bind.{key}: {place} reads a value inside a text, but evaluation.request."
            f"{'.'.join(['body', *map(str, place.path)])} holds a {type(text).__name__}; bind body.<path> without #"
        )
    # not part of a longer name nor a GraphQL variable ($alpha); the token not cut short
    found = list(re.finditer(rf"(?<![A-Za-z0-9_$]){re.escape(str(place.arg))}\s*:\s*({_TOKEN})(?![A-Za-z0-9_.])", text))
    if not found:
        raise _not_declared(key, place, f"its text has no '{place.arg}: <number or word>'")
    if len(found) > 1:
        raise ConfigError(
            f"target.request.bind.{key}: {place} is ambiguous: its text writes '{place.arg}:' {len(found)} times; "
            "keep one (or bind a text that holds it once)"
        )
    return found


def _read_arg(text: Any, place: Place, key: str) -> Any:
    token = _arg_matches(text, place, key)[0].group(1)
    if token in ("true", "false"):
        return token == "true"
    if re.fullmatch(_NUMBER, token):
        return json.loads(token)
    return token


def _write_arg(text: Any, place: Place, value: Any, key: str) -> str:
    """``text`` with the bound argument's value replaced by ``value``'s token."""
    found = _arg_matches(text, place, key)[0]
    value = _json_value(value, key)
    token = json.dumps(value) if isinstance(value, (bool, int, float)) else value
    if not isinstance(token, str) or not re.fullmatch(_TOKEN, token):
        raise ConfigError(
            f"{key}: {value!r} cannot be written as '{place.arg}: <value>' in {place} (a number, true / false "
            "or a word of letters, digits and _ only); make the search space's choices such words"
        )
    return f"{text[: found.start(1)]}{token}{text[found.end(1) :]}"


def _get(body: Any, path: tuple[str | int, ...]) -> Any:
    node = body
    for seg in path:
        node = node[seg]
    return node


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
