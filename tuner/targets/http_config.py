"""A backend's config as a JSON document behind an HTTP API (``target.channel: http``):
read it, write it, confirm a write, and the restore journal of the original.

`HttpConfigStore` is the side effect: ``GET url`` answers the document (and maybe an
``ETag``); a write sends a whole document by ``PUT`` / ``POST`` (with ``If-Match`` when
the server gave an ETag, so a document changed by someone else since we read it is
refused with 412 instead of overwritten); a write is confirmed by reading it back (the
served document must equal the one sent, compared as JSON) or by a fingerprint in the
health answer (it must equal the ETag the write answered). Any refusal is a one-line
TargetError quoting the server's status and its error detail.

A server whose GET wraps the document (OpenSearch answers ``{"NAME": {...}}`` for the
pipeline that ``PUT`` takes bare) names its place (``document: NAME``): that value is
the document read, patched, sent and compared, written back as indented JSON.

`HttpJournal` keeps the original, exactly as the server returned it (bytes, content
type, ETag), in the study's state dir from before the first write until it is put back
and confirmed: at the end of a run, on SIGTERM, and at the next start after a SIGKILL
(tuner.study.wiring.prepare replays it). It holds no header: the experiment's headers
(secrets) are given again by whoever replays it.

    store = HttpConfigStore(url, method="PUT", headers={}, timeout_s=30, health_url=None, fingerprint=None)
        .get() -> Fetched                        # body bytes, content type, etag
        .write(body: bytes, if_match=None) -> str | None   # the ETag the write answered
        .confirm(sent: bytes, etag) -> None      # read-back (or fingerprint); TargetError when it differs
    journal = HttpJournal(path, owner=None)
        .active; .begin(fetched, url); .original() -> Fetched; .restore(store) -> bool; .pending_line()
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.errors import TargetError
from tuner.files import atomic_write, display_path, fsync_dir
from tuner.pids import pid_alive
from tuner.secrets import redact_text, redact_url

JOURNAL_VERSION = 1


@dataclass(frozen=True)
class Fetched:
    """A config document as the server answered it."""

    body: bytes
    content_type: str
    etag: str | None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class HttpConfigStore:
    """Reads and writes one config document over HTTP (module doc)."""

    def __init__(
        self,
        url: str,
        *,
        method: str = "PUT",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        read_back: bool = True,
        health_url: str | None = None,
        health_headers: Mapping[str, str] | None = None,
        fingerprint: str | None = None,
        document: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self.document = document
        self.method = method
        self.read_back = read_back
        self.health_url = health_url
        self.health_headers = dict(health_headers or {})  # target.health.headers, over the store's own
        self.fingerprint = fingerprint
        self.shown = redact_url(url)
        self._client = httpx.Client(headers=dict(headers or {}), timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._client.close()

    def get(self) -> Fetched:
        """The document as served now; TargetError when it cannot be read or is not a JSON object."""
        answer = self._call("GET", self.url)
        if answer.status_code != 200:
            raise TargetError(f"GET {self.shown}: {_refusal(answer)}; the config document cannot be read")
        try:
            doc = json.loads(answer.content)
        except ValueError as exc:
            raise TargetError(
                f"GET {self.shown}: the answer is not JSON ({exc}); point target.http.url at the config document"
            ) from exc
        if isinstance(doc, dict) and self.document is not None:
            doc = self._inner(doc)
        if not isinstance(doc, dict):
            raise TargetError(
                f"GET {self.shown}: the answer is a JSON {type(doc).__name__}, not an object; "
                "point target.http.url at the config document"
            )
        return Fetched(
            answer.content, answer.headers.get("content-type", "application/json"), answer.headers.get("etag")
        )

    def _inner(self, answer: dict[str, Any]) -> Any:
        from tuner.config.formats.paths import MISSING, get_path

        assert self.document is not None
        inner = get_path(answer, self.document)
        if inner is MISSING:
            keys = ", ".join(sorted(map(str, answer))) or "none"
            raise TargetError(
                f"GET {self.shown}: the answer has no {self.document!r} (keys: {keys}); "
                "fix target.http.document (the document's place in the GET answer) or remove it"
            )
        return inner

    def unwrap(self, body: bytes) -> bytes:
        """The document in a GET answer: the body itself, or (``document``: the answer
        wraps it, as OpenSearch's ``{"NAME": {...}}``) that value as indented JSON."""
        if self.document is None:
            return body
        inner = self._inner(json.loads(body))
        return (json.dumps(inner, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    def write(self, body: bytes, *, content_type: str = "application/json", if_match: str | None = None) -> str | None:
        """Send ``body`` as the whole document; the ETag the server answered (None when it gives none).
        TargetError quoting the server's refusal (a 4xx's detail) otherwise."""
        headers = {"Content-Type": content_type}
        if if_match is not None:
            headers["If-Match"] = if_match
        answer = self._call(self.method, self.url, content=body, headers=headers)
        if not 200 <= answer.status_code < 300:
            stale = " (someone changed the config since the tuner read it)" if answer.status_code == 412 else ""
            raise TargetError(
                f"{self.method} {self.shown} refused{stale}: {_refusal(answer)}; the served config is unchanged"
            )
        return answer.headers.get("etag")

    def confirm(self, sent: bytes, etag: str | None) -> None:
        """The server serves ``sent``: read back and compared as JSON (``read_back``), or
        the health answer's fingerprint equals the write's ETag. TargetError naming the
        first difference otherwise: a number measured on a config nobody confirmed is
        worth nothing."""
        if self.read_back:
            served = json.loads(self.unwrap(self.get().body))
            want = json.loads(sent)
            if served != want:
                raise TargetError(
                    f"read-back of {self.shown} differs from the document sent ({first_difference(want, served)}); "
                    "the backend does not serve what the tuner wrote, so nothing is measured on it"
                )
            return
        if self.fingerprint is None or self.health_url is None:
            return
        if etag is None:
            raise TargetError(
                f"{self.method} {self.shown} answered no ETag, so target.http.fingerprint cannot confirm the write; "
                "use read_back: true"
            )
        from tuner.targets.health import health_fingerprint

        answer = self._call("GET", self.health_url, headers=self.health_headers)
        try:
            body = answer.json()
        except ValueError:
            body = None
        got = health_fingerprint(body, self.fingerprint)
        if got.strip('"') != _bare(etag):
            raise TargetError(
                f"health {self.fingerprint} is {got[:16]}..., not the ETag {_bare(etag)[:16]}... the write of "
                f"{self.shown} answered: the backend does not serve what the tuner wrote"
            )

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise TargetError(f"{method} {redact_url(url)}: {type(exc).__name__}: {redact_text(str(exc))}") from exc


def _bare(etag: str) -> str:
    """An ETag without ``W/`` and its quotes."""
    return etag.removeprefix("W/").strip('"')


def _refusal(answer: httpx.Response) -> str:
    """``HTTP 422: <the server's detail>`` in one line (a JSON error body's detail / error /
    message, else its text, cut)."""
    detail: Any = None
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        for key in ("detail", "error", "message", "reason"):
            if key in body:
                detail = body[key]
                break
        if isinstance(detail, Mapping):  # OpenSearch: {"error": {"reason": ...}}
            detail = detail.get("reason") or json.dumps(detail)
    text = str(detail) if detail is not None else answer.text
    text = " ".join(text.split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"HTTP {answer.status_code}: {redact_text(text) or '(empty body)'}"


def first_difference(want: Any, got: Any, where: str = "") -> str:
    """The first dotted path where two JSON documents differ, with both values."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in list(want) + [k for k in got if k not in want]:
            path = f"{where}.{key}" if where else str(key)
            if key not in got:
                return f"{path}: sent, not served"
            if key not in want:
                return f"{path}: served, not sent"
            if want[key] != got[key]:
                return first_difference(want[key], got[key], path)
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return first_difference(a, b, f"{where}.{i}" if where else str(i))
    return f"{where or 'the document'}: sent {json.dumps(want)[:60]}, served {json.dumps(got)[:60]}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HttpJournal:
    """The original document of an HTTP config, on disk (0600: it may hold secrets)
    until it is put back and confirmed (module doc). ``path`` / ``owner`` / ``active``
    as tuner.config.journal.Journal's."""

    def __init__(self, path: Path, owner: str | None = None) -> None:
        self.path = Path(path)
        self.owner = owner

    @property
    def active(self) -> bool:
        return self.path.exists()

    def begin(self, fetched: Fetched, url: str) -> None:
        """Record ``fetched`` as the original of ``url`` (no-op when a journal exists)."""
        if self.active:
            return
        payload = {
            "version": JOURNAL_VERSION,
            "kind": "http",
            "url": url,
            "created_at": time.time(),
            "pid": os.getpid(),
            **({"owner": self.owner} if self.owner else {}),
            "content_type": fetched.content_type,
            "etag": fetched.etag,
            "sha256": _sha256(fetched.body),
            "content_b64": base64.b64encode(fetched.body).decode("ascii"),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(payload, indent=1).encode("utf-8"), mode=0o600)

    def load(self) -> dict[str, Any]:
        try:
            payload = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TargetError(
                f"{display_path(self.path)}: unreadable restore journal ({exc}); restore the config document by hand"
            ) from exc
        if payload.get("version") != JOURNAL_VERSION or payload.get("kind") != "http":
            raise TargetError(f"{display_path(self.path)}: not an HTTP config restore journal this tuner knows")
        return dict(payload)

    def original(self) -> Fetched:
        payload = self.load()
        body = base64.b64decode(payload["content_b64"])
        if _sha256(body) != payload["sha256"]:
            raise TargetError(f"{display_path(self.path)}: the journaled original is corrupt (sha256 mismatch)")
        return Fetched(body, str(payload.get("content_type") or "application/json"), payload.get("etag"))

    def restore(self, store: HttpConfigStore) -> bool:
        """PUT the original back byte for byte unless it is served already, confirm it by
        read-back (compared as JSON), then remove the journal. True when a write was
        needed. The journal stays when any step fails (TargetError), for the next start."""
        if not self.active:
            return False
        payload = self.load()
        if payload.get("url") != store.url:
            raise TargetError(
                f"{display_path(self.path)}: the journal is for {redact_url(str(payload.get('url')))}, not "
                f"{store.shown}; put target.http.url back, or restore that document by hand and delete the journal"
            )
        original = self.original()
        document = store.unwrap(original.body)  # the whole answer, byte for byte, unless GET wraps it
        want = json.loads(document)
        wrote = json.loads(store.unwrap(store.get().body)) != want
        if wrote:
            store.write(document, content_type=original.content_type.split(";")[0] or "application/json")
            served = json.loads(store.unwrap(store.get().body))
            if served != want:
                raise TargetError(
                    f"restored the original of {store.shown}, but the read-back differs "
                    f"({first_difference(want, served)}); the journal {display_path(self.path)} is kept"
                )
        self.path.unlink()
        fsync_dir(self.path.parent)
        return wrote

    def shown_url(self) -> str:
        """The journaled document's URL, secrets hidden."""
        return redact_url(str(self.load().get("url")))

    def whose(self) -> str:
        """Whose writes this journal undoes, for a line a person reads."""
        payload = self.load()
        pid = payload.get("pid")
        alive = isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)
        created = payload.get("created_at")
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created)) if isinstance(created, (int, float)) else "?"
        )
        state = "still running" if alive else "no longer running"
        return f"{payload.get('owner') or 'a tuner command'} (pid {pid}, {state}; journal written {when})"
