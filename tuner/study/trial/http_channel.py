"""The HTTP config channel (``target.channel: http``): the backend's config is a JSON
document behind an HTTP API (tuner.targets.http_config); a trial GETs nothing, patches
the document as found, writes it back and confirms it, then measures.

`HttpConfigPatcher` stands where tuner.config.configpatch.ConfigPatcher stands for
files, with the same promises: the document as found (GET once, at prepare) is the
baseline and what the search space is checked against, exactly as a config file is; a
trial's text is that document with its dotted paths patched by the JSON format's
span-preserving patch (tuner.config.formats.json_format), so the result cache's key, the
config snapshot and MLflow cover the document as sent; before the first write the
original is journaled exactly as the server returned it (bytes, content type, ETag);
``restore()`` puts it back byte for byte, confirmed by read-back, and only then removes
the journal. Every write carries ``If-Match`` with the last ETag the server gave (a
document someone else changed meanwhile is refused, 412, never overwritten) and is
confirmed by read-back (or the health fingerprint); a write that is refused or not
confirmed fails the trial with the server's reason, and nothing is measured on it.

The trial's `ConfigWriter` is tuner.study.wiring.PatcherWriter over this patcher, told
that it does not touch the backend (nothing to restart at the end: restore writes the
original through the API).
`HttpServe` stands in for the reload applier: the write already served the document, a
trial asks the backend's health only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.configpatch import unified_diff
from tuner.config.formats import json_format
from tuner.errors import ConfigError
from tuner.secrets import redact_url
from tuner.targets.http_config import Fetched, HttpConfigStore, HttpJournal

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment

#: the key of a trial's one config text, the document at target.http.url (no such file
#: is written; absolute, so its name is the same from any working directory)
HTTP_TEXT = Path("/http-config.json")


class HttpConfigPatcher:
    """The config document at a URL, patched like a JSON config file (module doc). Offers
    ConfigPatcher's ``files`` / ``names`` / ``notes`` / ``journal`` / ``base_texts`` /
    ``documents`` / ``render`` / ``write`` / ``restore`` / ``diff``."""

    def __init__(self, store: HttpConfigStore, journal: HttpJournal) -> None:
        self.store = store
        self.journal = journal
        self.files = [HTTP_TEXT]
        self.names = [store.shown]
        self.notes: list[str] = []
        # production as found: the journaled original when a journal is on disk (a live
        # run's, re-entered), else the document served now
        self.found: Fetched = journal.original() if journal.active else store.get()
        self.etag: str | None = self.found.etag  # the If-Match of the next write
        self._written: bytes | None = None  # what the server serves now, as far as this process knows

    @property
    def journal_active(self) -> bool:
        return self.journal.active

    def base_texts(self) -> list[str]:
        return [self.store.unwrap(self.found.body).decode("utf-8")]

    def documents(self) -> list[Any]:
        return [json_format.load(self.base_texts()[0], self.names[0])]

    def render(self, edits: Mapping[int, Mapping[str, Any]], *, verbatim: bool = True) -> dict[Path, str]:
        for index in edits:
            if index != 0:
                raise ConfigError(f"config file index {index} out of range (channel: http has one document)")
        text = self.base_texts()[0]
        file_edits = edits.get(0, {})
        return {
            HTTP_TEXT: json_format.patch(text, file_edits, self.names[0], verbatim=verbatim) if file_edits else text
        }

    def write(self, texts: Mapping[Path, str]) -> None:
        """Journal the original (once), write the document, confirm it is served."""
        unknown = [p for p in texts if Path(p) != HTTP_TEXT]
        if unknown:
            raise ConfigError(f"{unknown[0]} is not the channel's document (render() output only)")
        body = texts[HTTP_TEXT].encode("utf-8")
        if body == self._written:
            return  # served already, and confirmed when it was written
        self.journal.begin(self.found, self.store.url)
        self._written = None  # unknown from here until confirmed
        etag = self.store.write(body, content_type=_media_type(self.found.content_type), if_match=self.etag)
        self.etag = etag if etag is not None else None
        self.store.confirm(body, etag)
        self._written = body

    def restore(self) -> list[Path]:
        """The original back (byte for byte, confirmed by read-back), the journal removed."""
        wrote = self.journal.restore(self.store)
        self._written = None
        self.etag = None  # the original's ETag may differ from the journaled one
        return [HTTP_TEXT] if wrote else []

    def diff(self, edits: Mapping[int, Mapping[str, Any]]) -> str:
        """The change as people read it: both documents laid out one key a line (a server
        may answer its document on one line), key order kept."""
        before, after = self.base_texts()[0], self.render(edits)[HTTP_TEXT]
        return unified_diff(_laid_out(before), _laid_out(after), self.names[0])

    def close(self) -> None:
        self.store.close()


def _laid_out(text: str) -> str:
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"


def _media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip() or "application/json"


@dataclass(frozen=True)
class Served:
    """What `HttpServe.apply` did (the shape of tuner.targets.reload's answer)."""

    mode: str
    reason: str
    health: Any


class HttpServe:
    """Stands in for the reload applier: the confirmed write is the apply; a trial asks
    the backend's health (up, and its data fingerprint)."""

    def __init__(self, wait_healthy: Callable[[], Any]) -> None:
        self.wait_healthy = wait_healthy

    def prepare(self, texts: Mapping[Path, str]) -> None:
        return None

    def adopt(self, texts: Mapping[Path, str], health: Any) -> str | None:
        return None

    def close(self) -> None:
        return None

    def apply(self, texts: Mapping[Path, str], *, phase: Callable[[str], Any]) -> Served:
        with phase("health"):
            health = self.wait_healthy()
        return Served("http", "", health)


def store_of(experiment: Experiment) -> HttpConfigStore:
    """The experiment's ``target.http`` as a store (``{port}`` filled by bind_port)."""
    if isinstance(experiment.target.port, int):  # {port} filled as a run fills it (bound already: unchanged)
        experiment = experiment.bind_port()
    http = experiment.target.http
    if http is None:
        raise ConfigError(f"{experiment.source}: target.channel: http needs target.http.url")
    return HttpConfigStore(
        http.url,
        method=http.method,
        headers=http.headers,
        timeout_s=http.timeout_s,
        read_back=http.read_back,
        health_url=experiment.target.health.url,
        health_headers=experiment.target.health.headers,
        fingerprint=http.fingerprint,
        document=http.document,
    )


def recover_http(experiment: Experiment) -> str | None:
    """Replay a restore journal a killed process left (the original PUT back, confirmed);
    the line saying so, or None when there was none. The caller holds the locks."""
    journal = HttpJournal(experiment.http_journal_path)
    if not journal.active:
        return None
    whose = journal.whose()
    store = store_of(experiment)
    try:
        wrote = journal.restore(store)
    finally:
        store.close()
    done = "wrote the original back (confirmed by read-back)" if wrote else "it was served already, nothing written"
    return f"replayed the restore journal {journal.path} left by {whose}: {redact_url(store.url)} {done}"


def http_patcher_of(experiment: Experiment) -> HttpConfigPatcher:
    """The experiment's document, read now (the baseline)."""
    store = store_of(experiment)
    try:
        return HttpConfigPatcher(store, HttpJournal(experiment.http_journal_path))
    except BaseException:
        store.close()
        raise
