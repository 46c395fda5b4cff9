"""Patch a backend's config files in place, keeping them as the user wrote them.

Each file is YAML, JSON or TOML by its suffix (tuner.config.formats: one module per
format, each keeping what its format can keep: comments, key order, indentation; only the
patched values change). YAML goes through ruamel.yaml round-trip (``YAML()`` object API,
0.19): comments, key order, quoting, flow style (``[30, 90]``, ``{bm25: 1.0}``) and
int-versus-float spelling survive.

Every write is atomic (temp file in the same directory, fsync, ``os.replace``) and keeps
the replaced file's owner, group and mode (tuner.files). Before the first write the
restore journal (tuner.config.journal) records each file's original bytes, so the
originals can be put back byte for byte by ``restore()`` -- or by
``tuner.config.journal.recover(journal)`` at the next start-up after a crash.
While a journal is active every render starts from the journaled originals, so a
trial's files never depend on what the previous trial wrote.

Public API::

    ConfigPatcher(config_files, journal_path=None)
        .files: list[Path]; .names: list[str]; .formats: list[ConfigFormat]
        .notes: list[str]                           # files written in place (owner not keepable)
        .documents() -> list[Mapping]               # the base documents (originals), parsed
        .render(edits) -> dict[Path, str]           # text of every config file, nothing written
                                                    # (a file no edit changes: its bytes as found)
        .apply(edits) -> dict[Path, str]            # journal (once), then atomic writes
        .write(texts) -> None                       # write render() output the same way
        .restore() -> list[Path]                    # originals back, journal removed
        .diff(edits) -> str                         # unified diff base -> patched
        .journal_active -> bool
    patch_text(text, edits, name) -> str            # one YAML file's text, patched
    load_text(text, path) -> Mapping                # any config file's text, parsed by its suffix
    unified_diff(before, after, name) -> str
    get_path(doc, dotted) -> value | MISSING; all_paths(doc) -> list[str]

``edits`` is ``{file index: {dotted.path: value}}`` (see ``SearchSpace.edits``).
A dotted path walks mappings by key and lists by integer index (``a.list.0``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.config.formats import ConfigFormat, format_for, yaml_format
from tuner.config.formats.paths import MISSING, all_paths, get_path, split_path
from tuner.config.journal import Journal
from tuner.errors import ConfigError
from tuner.files import FileMeta, atomic_write, display_path, in_place_reason

__all__ = ["MISSING", "ConfigPatcher", "all_paths", "get_path", "load_text", "patch_text", "split_path", "unified_diff"]

Edits = Mapping[int, Mapping[str, Any]]


# ---------------------------------------------------------------- the patcher


class ConfigPatcher:
    """Patches a fixed list of config files (the target's ``config_files``; YAML, JSON or
    TOML; none with ``target.channel: request``, whose values travel in the requests)."""

    def __init__(self, config_files: Sequence[Path | str], journal_path: Path | None = None) -> None:
        self.files = [Path(f) for f in config_files]
        self.names = [display_path(f) for f in self.files]
        self.journal = Journal(journal_path) if journal_path is not None else None
        self.formats: list[ConfigFormat] = [format_for(f) for f in self.files]
        for f in self.files:
            if not f.is_file():
                raise ConfigError(f"{display_path(f)}: config file not found (check target.config_files)")
        # Files whose owner a replacement cannot keep: written in place (see atomic_write).
        # For the CLI to show; a fallback nobody predicted is added when it happens.
        self.notes: list[str] = [n for n in map(in_place_reason, self.files) if n is not None]

    @property
    def journal_active(self) -> bool:
        return self.journal is not None and self.journal.active

    def base_texts(self) -> list[str]:
        """The texts edits apply to: the journaled originals while a journal is active."""
        originals = self.journal.originals() if self.journal is not None and self.journal.active else {}
        out = []
        for f in self.files:
            data = originals.get(f.resolve())
            out.append((data if data is not None else f.read_bytes()).decode("utf-8"))
        return out

    def documents(self) -> list[Any]:
        return [
            fmt.load(text, name) for fmt, text, name in zip(self.formats, self.base_texts(), self.names, strict=True)
        ]

    def render(self, edits: Edits, *, verbatim: bool = True) -> dict[Path, str]:
        """The text of every config file with ``edits`` applied; nothing is written. A file
        none of whose values change is its text as found (see `patch_text`)."""
        for index in edits:
            if not 0 <= index < len(self.files):
                raise ConfigError(f"config file index {index} out of range (the target has {len(self.files)})")
        out: dict[Path, str] = {}
        for i, (f, text) in enumerate(zip(self.files, self.base_texts(), strict=True)):
            file_edits = edits.get(i, {})
            patch = self.formats[i].patch
            out[f] = patch(text, file_edits, self.names[i], verbatim=verbatim) if file_edits else text
        return out

    def apply(self, edits: Edits) -> dict[Path, str]:
        """Render, record the originals in the journal (once), write changed files atomically."""
        texts = self.render(edits)
        self.write(texts)
        return texts

    def write(self, texts: Mapping[Path, str]) -> None:
        """Write already rendered texts (from :meth:`render`): journal first, then atomically."""
        unknown = [p for p in texts if Path(p) not in self.files]
        if unknown:
            raise ConfigError(f"{unknown[0]} is not one of target.config_files (render() output only)")
        if self.journal is not None:
            self.journal.begin(self.files)
        for path, text in texts.items():
            data = text.encode("utf-8")
            if Path(path).read_bytes() != data and not atomic_write(Path(path), data):
                self._note_in_place(Path(path))

    def _note_in_place(self, path: Path) -> None:
        name = display_path(path)
        if not any(n.startswith(f"{name}: ") for n in self.notes):
            meta = FileMeta.of(path)
            owner = f" ({meta.describe()})" if meta is not None else ""
            self.notes.append(
                f"{name}: a replacement could not be given its owner{owner}: "
                "it is rewritten in place (owner and mode kept, not atomic)"
            )

    def restore(self) -> list[Path]:
        """Originals back byte for byte; the journal is removed. Returns the files rewritten."""
        return self.journal.restore() if self.journal is not None else []

    def close(self) -> None:
        """Nothing to close (channel: http's patcher closes its HTTP client here)."""

    def diff(self, edits: Edits) -> str:
        base = self.base_texts()
        rendered = self.render(edits)
        return "".join(
            unified_diff(before, rendered[f], name)
            for f, before, name in zip(self.files, base, self.names, strict=True)
        )


def unified_diff(before: str, after: str, name: str) -> str:
    """A ``diff -u`` style text (empty when equal)."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        )
    )


def load_text(text: str, path: Path | str, name: str | None = None) -> Any:
    """A config file's text parsed by the format its suffix names (tuner.config.formats)."""
    return format_for(path).load(text, name or display_path(Path(path)))


# YAML patching as it always was (callers that patch a YAML text they hold)
patch_text = yaml_format.patch
