"""What counts as a secret, and how it is kept out of what the tuner writes and prints.

A value is secret by where it sits (its name), never by what it looks like:

- request headers ``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie``;
- any header, query parameter or body field whose name has a part ``key``, ``token``,
  ``secret``, ``password``, ``passwd``, ``pwd``, ``credential`` or ``auth`` at its end
  (``X-Api-Key``, ``apikey``, ``access_token``, ``clientSecret``, ``db_password``), in
  any case and spelling (kebab, snake, camel). ``keywords``, ``max_tokens`` and
  ``author`` are not: the part must not run on into more letters;
- the password of a URL (``scheme://user:PASSWORD@host``, tuner.study.storage.database.redact);
- the names an experiment lists in ``evaluation.request.secret_fields``.

Each is replaced by ``***`` (REDACTED)::

    redact_mapping(mapping, extra_names=())   # keys by name, nested; string values by redact_text
    redact_url(url, extra_names=())           # password and secret query parameters
    redact_spec(spec_dict)                    # an EvalSpec.model_dump(): headers, url, body
    redact_text(text)                         # free text: URLs in it, `Bearer X`, `name=value`, known values

Free text (an error message, a backend's echo, a config snapshot) has no names to go by,
so the secrets read from config files are also remembered by value, process-wide
(`remember`, done by tuner.config.yamlfile when it loads an experiment or spec), and
`scrub_known` / `redact_text` replace every occurrence. Values shorter than
MIN_KNOWN_LENGTH are not remembered: replacing ``tuner`` everywhere would wreck every
report, and a value that short is no secret worth the name.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

REDACTED = "***"
MIN_KNOWN_LENGTH = 8

_EXACT_NAMES = frozenset({"authorization", "proxy_authorization", "cookie", "set_cookie"})
# A name part that makes a name secret; it may follow anything (``apikey``), but must
# not run on into letters (``keywords``, ``max_tokens``, ``author`` stay visible).
_SECRET_PART = re.compile(r"(?:keys?|token|secrets?|passwords?|passwd|pwd|credentials?|auth|cookie)(?![a-z])")
# Keys of the tuner's own files that name secrets, or config keys, without holding a
# secret (``restart_keys`` lists config keys: scrubbed, they garbled the run's start line).
_NOT_SECRET = frozenset({"secret_fields", "restart_keys"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>`]+")
# An Authorization value in prose: the scheme as headers spell it, then a credential of
# 8+ characters with a digit in it ("a basic settings error" is left alone).
_AUTH_SCHEME = re.compile(r"\b((?i:bearer)|Basic|Digest|Token)(\s+)(?=[A-Za-z._~+/=\-]*\d)([A-Za-z0-9._~+/=\-]{8,})")
# ``name=value`` or ``name: value``; an auth scheme before the value is part of it.
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-])([A-Za-z_][\w.\-]*)(\s*[=:]\s*)((?:(?i:bearer|basic|token|digest)\s+)?[^\s&'\",;]+)"
)
# Prose says "key: doc_id" and "keys: a, b"; as a bare word before a colon they are no secret.
_PROSE_NAMES = frozenset({"key", "keys"})


def normalise_name(name: str) -> str:
    """``X-Api-Key``, ``x_api_key``, ``xApiKey`` -> ``x_api_key``."""
    return re.sub(r"[^a-z0-9]+", "_", _CAMEL.sub("_", str(name)).lower()).strip("_")


def is_secret_name(name: str, extra_names: Iterable[str] = ()) -> bool:
    """True when a header / parameter / field called ``name`` holds a secret (module docstring)."""
    norm = normalise_name(name)
    if norm in _NOT_SECRET:
        return False
    if norm in _EXACT_NAMES or _SECRET_PART.search(norm) is not None:
        return True
    return norm in {normalise_name(n) for n in extra_names}


# --------------------------------------------------------------------------- known values


class _KnownValues:
    """Secret values read by this process, for scrubbing free text. Never written anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._env: dict[str, str] = {}
        self._pattern: re.Pattern[str] | None = None

    def add(self, value: str) -> None:
        forms = {value}
        scheme, _, credential = value.partition(" ")
        if credential and scheme.isalpha():  # "Bearer X": X alone is the secret
            forms.add(credential.strip())
        forms |= {json.dumps(f, ensure_ascii=False)[1:-1] for f in forms}  # as it appears inside JSON text
        forms |= {quote(f, safe="") for f in forms}  # as it appears in a URL
        kept = {f for f in forms if len(f) >= MIN_KNOWN_LENGTH}
        with self._lock:
            if not kept <= self._values:
                self._values |= kept
                self._pattern = None

    def note_env(self, name: str, value: str) -> None:
        with self._lock:
            self._env.setdefault(value, name)

    def env_name(self, value: str) -> str | None:
        with self._lock:
            return self._env.get(value)

    def pattern(self) -> re.Pattern[str] | None:
        with self._lock:
            if self._pattern is None and self._values:
                # Longest first: a value that contains another is replaced whole.
                alternatives = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(v) for v in alternatives))
            return self._pattern

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._env.clear()
            self._pattern = None


_KNOWN = _KnownValues()


def remember(*values: Any) -> None:
    """Treat each string value (of at least MIN_KNOWN_LENGTH characters) as a secret
    wherever it turns up in free text from now on, in this process."""
    for value in values:
        if isinstance(value, str) and value:
            _KNOWN.add(value)


def known_values() -> list[str]:
    """The values remembered as secret in this process (to hand to a helper process that
    writes free text for it: tuner.report.report_worker)."""
    with _KNOWN._lock:
        return sorted(_KNOWN._values)


def remember_env(name: str, value: str) -> None:
    """Record that ``value`` came from environment variable ``name`` (tuner.config.yamlfile), so a
    printed command can refer to ``$NAME`` instead of the value."""
    _KNOWN.note_env(name, value)


def env_name_of(value: str) -> str | None:
    """The environment variable a config value was expanded from, if any."""
    return _KNOWN.env_name(value)


def forget_all() -> None:
    """Drop every remembered value (tests; a long-lived process that loads another project)."""
    _KNOWN.clear()


def remember_config(data: Any, extra_names: Iterable[str] = ()) -> None:
    """Remember every value a loaded config holds in a secret place: values under secret
    names (at any depth), secret query parameters of URLs, and the names listed in any
    ``secret_fields`` of the document."""
    names = set(extra_names) | set(_secret_fields_anywhere(data))
    remember(*secret_values(data, names))


def secret_values(data: Any, extra_names: Iterable[str] = ()) -> list[str]:
    """The string values ``redact_mapping`` would hide in ``data``, plus the secret parts
    of the URLs in it (query parameters; passwords are left to the structural rules)."""
    names = tuple(extra_names)
    found: list[str] = []

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, secret or is_secret_name(str(key), names))
        elif isinstance(node, list | tuple):
            for value in node:
                walk(value, secret)
        elif isinstance(node, str):
            if secret:
                found.append(node)
            else:
                for match in _URL.finditer(node):
                    query = urlsplit(match.group(0)).query
                    found.extend(v for k, v in parse_qsl(query, keep_blank_values=True) if is_secret_name(k, names))

    walk(data, False)
    return found


def _secret_fields_anywhere(data: Any) -> list[str]:
    out: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key == "secret_fields" and isinstance(value, list | tuple):
                out += [str(v) for v in value]
            else:
                out += _secret_fields_anywhere(value)
    elif isinstance(data, list | tuple):
        for value in data:
            out += _secret_fields_anywhere(value)
    return out


# --------------------------------------------------------------------------- redaction


def scrub_known(text: str) -> str:
    """``text`` with every remembered secret value replaced by REDACTED."""
    pattern = _KNOWN.pattern()
    return text if pattern is None or not text else pattern.sub(REDACTED, text)


def redact_url(url: str, extra_names: Iterable[str] = ()) -> str:
    """``url`` with its password and the values of secret query parameters hidden; the
    rest (host, path, other parameters) is kept exactly as written."""
    names = tuple(extra_names)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return scrub_known(url)
    # netloc ends at the first "/", "?" or "#"; the query between "?" and "#".
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    if "@" in netloc:
        creds, _, host = netloc.rpartition("@")
        user, colon, _password = creds.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if colon else netloc
    before, qmark, after = tail.partition("?")
    if qmark:
        query, hash_, fragment = after.partition("#")
        query = "&".join(_redact_pair(pair, names) for pair in query.split("&"))
        tail = f"{before}?{query}{hash_}{fragment}"
    return scrub_known(f"{scheme}{sep}{netloc}{tail}")


def _redact_pair(pair: str, names: tuple[str, ...]) -> str:
    name, sep, _value = pair.partition("=")
    return f"{name}={REDACTED}" if sep and is_secret_name(name, names) else pair


def redact_text(text: str, extra_names: Iterable[str] = ()) -> str:
    """Free text with its secrets hidden: URLs in it (redact_url), an auth scheme's
    credential (``Bearer X``), ``name=value`` / ``name: value`` with a secret name, and
    every remembered value."""
    if not text:
        return text
    names = tuple(extra_names)
    out = _URL.sub(lambda m: redact_url(m.group(0), names), text)
    out = _ASSIGNMENT.sub(lambda m: _redact_assignment(m, names), out)
    out = _AUTH_SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", out)
    return scrub_known(out)


def _redact_assignment(match: re.Match[str], names: tuple[str, ...]) -> str:
    name, sep, value = match.group(1), match.group(2), match.group(3)
    if value == REDACTED or not is_secret_name(name, names):
        return match.group(0)
    if ":" in sep and name.lower() in _PROSE_NAMES:
        return match.group(0)
    return f"{name}{sep}{REDACTED}"


def redact_mapping(mapping: Mapping[Any, Any], extra_names: Iterable[str] = ()) -> dict[Any, Any]:
    """A copy of ``mapping``: every value under a secret name (at any depth) becomes
    REDACTED, other strings go through `redact_text`."""
    names = tuple(extra_names)
    return {
        key: REDACTED if is_secret_name(str(key), names) else _redact_value(value, names)
        for key, value in mapping.items()
    }


def _redact_value(value: Any, names: tuple[str, ...]) -> Any:
    if isinstance(value, Mapping):
        return redact_mapping(value, names)
    if isinstance(value, list | tuple):
        return [_redact_value(v, names) for v in value]
    if isinstance(value, str):
        return redact_text(value, names)
    return value


def secret_fields(spec: Any) -> tuple[str, ...]:
    """The extra secret names of an EvalSpec, its RequestMapping or their dicts
    (``request.secret_fields``); empty when the spec has none."""
    request = spec.get("request", spec) if isinstance(spec, Mapping) else getattr(spec, "request", spec)
    fields = request.get("secret_fields") if isinstance(request, Mapping) else getattr(request, "secret_fields", None)
    return tuple(str(f) for f in fields or ())


def redact_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An EvalSpec as a dict (``spec.model_dump(mode="json")``) safe to record: secret
    headers, body fields and query parameters hidden, the URL's password too. The
    header and field names stay, so a reader still sees what was sent."""
    return redact_mapping(spec, secret_fields(spec))
