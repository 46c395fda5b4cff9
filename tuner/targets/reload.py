"""Apply a trial's config by reload when the backend can take it, else by a restart.

``target.reload`` (tuner.config.target.ReloadConfig) says how the backend takes a new
config without a restart (an HTTP call, or a signal through the target) and where its
health JSON reports the sha256 of the config file it serves. A reload is confirmed
only when that fingerprint equals the sha256 of the bytes on disk; a refused or
unconfirmed reload, a changed restart-only key, or not knowing what the backend
serves, falls back to ``target.restart()`` + the health wait (what every trial does
without ``target.reload``).

    restart_reason(served, new, restart_keys) -> str | None   # pure: why this change needs a restart
    load_config_text(text, path) -> Any                       # a config text as data, by the file's suffix
    expected_fingerprint(texts, file_index) -> str            # pure: sha256 hex of a file's utf-8 bytes
    normalize_fingerprint(value) -> str                       # "sha256:ABC.." -> "abc.."
    serves_files(health, reload, config_files) -> bool        # the health answer proves the file is served
    ConfigApplier(target, wait_healthy, reload, health, config_files, served)
        .apply(texts, phase) -> Applied     # right after the texts were written
        .mark_served(texts) / .forget()     # the caller restarted the backend itself
        .adopt(texts, health) -> str | None # a started backend serves texts when its health says so
        .served -> dict[Path, str] | None; .close()
    Applied(mode: "reload" | "restart", reason: str | None, health: dict)

``phase(name)`` is a context manager factory the caller times its phases with:
``reload`` + ``confirm`` for a reload, ``restart`` + ``health`` for a restart (both
pairs on a fallback). An exception (HealthTimeout, BackendExited, ...) propagates and
leaves what the backend serves unknown: the next apply restarts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from tuner.config.target import HealthConfig, ReloadConfig
from tuner.errors import BackendExited, ConfigError, TargetError
from tuner.secrets import REDACTED, is_secret_name, redact_text
from tuner.targets.base import Target
from tuner.tls import shared_ssl_context

Phase = Callable[[str], AbstractContextManager[Any]]
UNKNOWN = "what the backend serves is unknown after the last failure"
_FIRST_POLL_S = 0.01
_MAX_POLL_S = 0.1
_MAX_REQUEST_TIMEOUT_S = 5.0
_SHOWN = 60  # characters of a value shown in a reason


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Any = _Missing()


# ---------------------------------------------------------------- pure decisions


#: parsed config texts the applier keeps: the served one, the one being applied, the next
PARSED_KEPT = 4


def restart_reason(
    served: Mapping[Path, str] | None,
    new: Mapping[Path, str],
    restart_keys: Sequence[str],
    load: Callable[[str, Path], Any] | None = None,
) -> str | None:
    """Why applying ``new`` needs a restart rather than a reload, in one line; None when
    a reload will do. ``served`` is what the backend serves (None: unknown). Each restart
    key is a dotted path ('*' matches one segment) compared in every config file.
    ``load`` parses a text of a file (default: by the file's suffix, `load_config_text`;
    ConfigApplier passes its cache)."""
    load = load or load_config_text
    if served is None:
        return UNKNOWN
    known = {Path(p): t for p, t in served.items()}
    for path, text in new.items():
        name = Path(path).name if len(new) > 1 else ""
        old = known.get(Path(path))
        if old is None:
            return f"what the backend serves of {Path(path).name} is unknown"
        if old == text or not restart_keys:
            continue
        try:
            before, after = load(old, Path(path)), load(text, Path(path))
        except (YAMLError, ConfigError) as exc:
            return f"{Path(path).name} cannot be compared for restart keys ({_first_line(exc)})"
        for pattern in restart_keys:
            diff = _pattern_difference(before, after, pattern.split("."), [])
            if diff is not None:
                return f"{name + ': ' if name else ''}{diff}: a restart-only key"
    return None


def expected_fingerprint(texts: Mapping[Path, str] | Sequence[str], file_index: int) -> str:
    """sha256 hex of config file ``file_index`` as the writer writes it: its text's utf-8
    bytes, no newline translation (ConfigPatcher.write). ``texts`` in config_files order."""
    values = list(texts.values()) if isinstance(texts, Mapping) else list(texts)
    return hashlib.sha256(values[file_index].encode("utf-8")).hexdigest()


def serves_files(health: Any, reload: ReloadConfig | None, config_files: Sequence[Path]) -> bool:
    """Whether a health answer proves the backend serves the config file on disk: it
    reports (``target.reload.fingerprint``) the sha256 of its bytes."""
    if reload is None or reload.fingerprint is None or not isinstance(health, Mapping):
        return False
    seen = _dotted(health, reload.fingerprint)
    if seen is _MISSING or seen is None or reload.fingerprint_file >= len(config_files):
        return False
    file = Path(config_files[reload.fingerprint_file])
    return normalize_fingerprint(seen) == hashlib.sha256(file.read_bytes()).hexdigest()


def normalize_fingerprint(value: Any) -> str:
    """A reported fingerprint as lowercase hex: an optional ``sha256:`` prefix dropped."""
    text = str(value).strip().lower()
    return text[len("sha256:") :] if text.startswith("sha256:") else text


def load_config_text(text: str, path: Path) -> Any:
    """A config file's text as plain data, parsed by its suffix (tuner.config.formats):
    YAML (and a file the seam does not know) by a safe load, JSON and TOML by their format."""
    from tuner.config.formats import BY_SUFFIX
    from tuner.config.formats import YAML as YAML_FORMAT

    fmt = BY_SUFFIX.get(path.suffix.lower(), YAML_FORMAT)
    if fmt is YAML_FORMAT:
        return _load(text)
    return fmt.load(text, path.name)


def _load(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


def _pattern_difference(a: Any, b: Any, segs: list[str], path: list[str]) -> str | None:
    if not segs:
        return _first_difference(a, b, path)
    seg, rest = segs[0], segs[1:]
    keys = list(dict.fromkeys(_children(a) + _children(b))) if seg == "*" else [seg]
    for key in keys:
        diff = _pattern_difference(_child(a, key), _child(b, key), rest, [*path, key])
        if diff is not None:
            return diff
    return None


def _children(node: Any) -> list[str]:
    if isinstance(node, Mapping):
        return [str(k) for k in node]
    if isinstance(node, list):
        return [str(i) for i in range(len(node))]
    return []


def _child(node: Any, key: str) -> Any:
    if isinstance(node, Mapping):
        return next((v for k, v in node.items() if str(k) == key), _MISSING)
    if isinstance(node, list) and key.isdigit() and int(key) < len(node):
        return node[int(key)]
    return _MISSING


def _first_difference(a: Any, b: Any, path: list[str]) -> str | None:
    """The first (deepest) difference between two subtrees, as one phrase."""
    if _same(a, b):
        return None
    where = ".".join(path)
    secret = any(is_secret_name(p) for p in path)
    if a is _MISSING:
        return f"{where} added ({_show(b, secret)})"
    if b is _MISSING:
        return f"{where} removed (was {_show(a, secret)})"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in dict.fromkeys(_children(a) + _children(b)):
            diff = _first_difference(_child(a, key), _child(b, key), [*path, key])
            if diff is not None:
                return diff
    return f"{where} changed ({_show(a, secret)} -> {_show(b, secret)})"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if _number(a) and _number(b):
        return a == b  # 1 and 1.0 are the same setting
    return type(a) is type(b) and a == b


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _show(value: Any, secret: bool) -> str:
    if secret:
        return REDACTED
    text = redact_text(json.dumps(value, default=str, ensure_ascii=False))
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


# ---------------------------------------------------------------- the applier


@dataclass(frozen=True)
class Applied:
    """How a config was applied: ``reason`` says why a restart happened although a
    reload is configured (None for a reload, or a restart without ``target.reload``)."""

    mode: Literal["reload", "restart"]
    reason: str | None
    health: dict[str, Any] = field(default_factory=dict)


def _no_phase(name: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


class ConfigApplier:
    """Applies written config texts to the backend; see the module docstring."""

    def __init__(
        self,
        target: Target,
        wait_healthy: Callable[[], Any],
        reload: ReloadConfig | None,
        health: HealthConfig,
        config_files: Sequence[Path],
        served: Mapping[Path, str] | None = None,
    ) -> None:
        self.target = target
        self.wait_healthy = wait_healthy
        self.reload = reload
        self.health = health
        self.config_files = [Path(f) for f in config_files]
        if reload is not None and reload.fingerprint_file >= len(self.config_files):
            raise ConfigError(
                f"target.reload.fingerprint_file {reload.fingerprint_file} is out of range "
                f"({len(self.config_files)} config file(s)); fix it in the experiment file"
            )
        self._served = None if served is None else {Path(p): t for p, t in served.items()}
        self._client: httpx.Client | None = None
        # config text -> its parse, for the restart-key comparison: a pure-Python YAML load
        # is ~5 ms a text (more beside other threads), and the served and the new text of
        # every apply are parsed ahead by ``prepare``, off the backend's path
        self._parsed: dict[tuple[str, str], Any] = {}
        self._parsed_lock = threading.Lock()

    def prepare(self, texts: Mapping[Path, str]) -> None:
        """Parse ``texts`` ahead of their ``apply`` (a pipelined trial's begin does it while
        another trial is measured); what cannot be parsed is left for ``apply`` to name."""
        if self.reload is None or not self.reload.restart_keys:
            return
        for path, text in texts.items():
            with contextlib.suppress(YAMLError, ConfigError):
                self._load(text, Path(path))

    def _load(self, text: str, path: Path) -> Any:
        key = (path.suffix.lower(), text)
        with self._parsed_lock:
            if key in self._parsed:
                return self._parsed[key]
        doc = load_config_text(text, path)
        with self._parsed_lock:
            self._parsed[key] = doc
            while len(self._parsed) > PARSED_KEPT:  # dicts keep insertion order: the oldest go first
                del self._parsed[next(iter(self._parsed))]
        return doc

    @property
    def served(self) -> dict[Path, str] | None:
        return None if self._served is None else dict(self._served)

    def mark_served(self, texts: Mapping[Path, str]) -> None:
        """The backend now serves ``texts`` (the caller restarted it on them)."""
        self._served = {Path(p): t for p, t in texts.items()}

    def adopt(self, texts: Mapping[Path, str], health: Any) -> str | None:
        """After the backend was started: it serves ``texts`` (the files on disk) when its
        health answer reports their fingerprint. Returns None then; else one line saying
        why not (what it serves stays unknown and the first apply restarts)."""
        if self.reload is None or self.reload.fingerprint is None:
            return "target.reload is not set"
        name = self.reload.fingerprint
        seen = _dotted(health, name) if isinstance(health, Mapping) else _MISSING
        if seen is _MISSING or seen is None:  # no such field: no reload can ever be confirmed
            keys = ", ".join(sorted(health)) if isinstance(health, Mapping) and health else "none"
            return (
                f"warning: the backend's health answer has no {name!r} (target.reload.fingerprint; its keys: "
                f"{keys}): no reload can be confirmed, so every trial will fall back to a restart; fix the "
                "field name, or drop target.reload"
            )
        file = self.config_files[self.reload.fingerprint_file]
        if normalize_fingerprint(seen) != hashlib.sha256(file.read_bytes()).hexdigest():
            return (
                f"the backend serves another config than {file.name} on disk (its fingerprint "
                f"{str(seen)[:12]}); the first trial restarts it, later ones reload"
            )
        self.mark_served(texts)
        return None

    def forget(self) -> None:
        """What the backend serves is unknown: the next apply restarts."""
        self._served = None

    def apply(self, texts: Mapping[Path, str], phase: Phase = _no_phase) -> Applied:
        """Apply ``texts`` (every config file's text, already written): a reload when
        configured and possible, else a restart. Returns how, and the health JSON."""
        try:
            applied = self._apply(texts, phase)
        except BaseException:
            self._served = None
            raise
        self.mark_served(texts)
        return applied

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _apply(self, texts: Mapping[Path, str], phase: Phase) -> Applied:
        if self.reload is None:
            return self._restart(phase, None)
        reason = restart_reason(self._served, texts, self.reload.restart_keys, self._load)
        if reason is None:
            # what the backend will read: the bytes on disk, hashed as the backend hashes them
            wrote = hashlib.sha256(self.config_files[self.reload.fingerprint_file].read_bytes()).hexdigest()
            with phase("reload"):
                refused = self._request()
            if refused is not None:
                reason = f"reload refused: {refused}"
            else:
                with phase("confirm"):
                    body, seen = self._confirm(wrote)
                if body is not None:
                    return Applied("reload", None, body)
                reason = f"reload not confirmed within {self.reload.confirm_deadline_s:g} s: {seen}, wrote {wrote[:12]}"
        return self._restart(phase, reason)

    def _restart(self, phase: Phase, reason: str | None) -> Applied:
        with phase("restart"):
            self.target.restart()
        with phase("health"):
            body = self.wait_healthy()
        return Applied("restart", reason, body if isinstance(body, dict) else {})

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(verify=shared_ssl_context())
        return self._client

    def _request(self) -> str | None:
        """Ask the backend to reload; None when it acknowledged, else why not (one line)."""
        assert self.reload is not None
        if self.reload.signal is not None:
            try:
                self.target.send_signal(self.reload.signal)
            except TargetError as exc:
                return f"{self.reload.signal} not delivered: {_first_line(exc)}"
            return None
        http = self.reload.http
        assert http is not None
        try:
            resp = self._http().request(http.method, http.url, headers=http.headers, timeout=http.timeout_s)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return redact_text(f"{http.method} {http.url} failed: {type(exc).__name__}: {_first_line(exc)}")
        if 200 <= resp.status_code < 300:
            return None
        return redact_text(f"HTTP {resp.status_code} from {http.method} {http.url}: {_error_line(resp)}")

    def _confirm(self, wrote: str) -> tuple[dict[str, Any] | None, str]:
        """Poll the health URL until the reported fingerprint is ``wrote``: (the health
        JSON, "") when it is, else (None, what was seen last) at the deadline."""
        assert self.reload is not None and self.reload.fingerprint is not None
        name = self.reload.fingerprint
        deadline = time.monotonic() + self.reload.confirm_deadline_s
        interval, seen = _FIRST_POLL_S, "no health answer"
        while True:
            failed = self.target.failure()
            if failed is not None:
                sig = self.reload.signal
                how = f"{sig} (a backend that does not handle {sig} dies of it)" if sig else "the reload call"
                raise BackendExited(f"backend exited after {how}: {failed}")
            left = deadline - time.monotonic()
            try:
                resp = self._http().get(
                    self.health.url, headers=self.health.headers, timeout=min(max(left, 0.05), _MAX_REQUEST_TIMEOUT_S)
                )
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                seen = f"health {type(exc).__name__}"
            else:
                if resp.status_code == 200:
                    body = _json(resp)
                    value = _dotted(body, name)
                    if value is _MISSING or value in (None, ""):
                        keys = ", ".join(sorted(map(str, body))) or "none"
                        return None, (
                            f"the health answer has no {name!r} (keys: {keys}; fix target.reload.fingerprint)"
                        )
                    got = normalize_fingerprint(value)
                    if got == wrote:
                        return body, ""
                    seen = f"backend serves {got[:12]}"
                else:
                    seen = f"health answered HTTP {resp.status_code}"
            left = deadline - time.monotonic()
            if left <= 0:
                return None, seen
            time.sleep(min(interval, left))
            interval = min(interval * 2, _MAX_POLL_S)


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {"body": body}


def _dotted(body: Mapping[str, Any], name: str) -> Any:
    node: Any = body
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _error_line(resp: httpx.Response) -> str:
    """The ``error`` field of a refusal's JSON, else the first line of its body."""
    body = _json(resp)
    error = body.get("error") or body.get("detail")
    if error:
        return _first_line(error if isinstance(error, str) else json.dumps(error))[:200]
    return _first_line(resp.text[:200]) if resp.text.strip() else "(empty body)"
