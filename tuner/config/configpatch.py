"""Patch a backend's YAML config files in place, keeping them as the user wrote them.

Patching goes through ruamel.yaml round-trip (``YAML()`` object API, 0.19): comments,
key order, quoting, flow style (``[30, 90]``, ``{bm25: 1.0}``) and int-versus-float
spelling survive; only the patched values change. Lists and mappings are updated in
place (``seq[:] = ...``) because replacing the node would lose its flow style.

Every write is atomic (temp file in the same directory, fsync, ``os.replace``) and keeps
the replaced file's owner, group and mode (tuner.files). Before the first write the
restore journal (tuner.config.journal) records each file's original bytes, so the
originals can be put back byte for byte by ``restore()`` -- or by
``tuner.config.journal.recover(journal)`` at the next start-up after a crash.
While a journal is active every render starts from the journaled originals, so a
trial's files never depend on what the previous trial wrote.

Public API::

    ConfigPatcher(config_files, journal_path=None)
        .files: list[Path]; .names: list[str]
        .notes: list[str]                           # files written in place (owner not keepable)
        .documents() -> list[CommentedMap]          # the base documents (originals)
        .render(edits) -> dict[Path, str]           # text of every config file, nothing written
                                                    # (a file no edit changes: its bytes as found)
        .apply(edits) -> dict[Path, str]            # journal (once), then atomic writes
        .write(texts) -> None                       # write render() output the same way
        .restore() -> list[Path]                    # originals back, journal removed
        .diff(edits) -> str                         # unified diff base -> patched
        .journal_active -> bool
    patch_text(text, edits, name) -> str            # one file's text, patched
    unified_diff(before, after, name) -> str
    get_path(doc, dotted) -> value | MISSING; all_paths(doc) -> list[str]

``edits`` is ``{file index: {dotted.path: value}}`` (see ``SearchSpace.edits``).
A dotted path walks mappings by key and lists by integer index (``a.list.0``).
"""

from __future__ import annotations

import copy
import difflib
import functools
import io
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import ScalarString

from tuner.config.journal import Journal
from tuner.config.yamlfile import did_you_mean, to_plain
from tuner.errors import ConfigError
from tuner.files import FileMeta, atomic_write, display_path, in_place_reason

Edits = Mapping[int, Mapping[str, Any]]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


# ---------------------------------------------------------------- dotted paths


def split_path(dotted: str) -> list[str | int]:
    """``"a.b.0"`` -> ``["a", "b", 0]``; integer segments index lists."""
    return [int(s) if s.isdigit() else s for s in dotted.split(".")]


def get_path(doc: Any, dotted: str) -> Any:
    """The value at ``dotted`` in ``doc``, or ``MISSING``."""
    node = doc
    for seg in split_path(dotted):
        if isinstance(node, Mapping):
            key: Any = seg if seg in node else str(seg)
            if key not in node:
                return MISSING
            node = node[key]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            node = node[seg]
        else:
            return MISSING
    return node


def all_paths(doc: Any, prefix: str = "") -> list[str]:
    """Every dotted path through nested mappings (for "did you mean" hints)."""
    out: list[str] = []
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            p = f"{prefix}{k}"
            out.append(p)
            out.extend(all_paths(v, p + "."))
    return out


# ---------------------------------------------------------------- the patcher


class ConfigPatcher:
    """Patches a fixed list of YAML config files (the target's ``config_files``; none with
    ``target.channel: request``, whose values travel in the requests)."""

    def __init__(self, config_files: Sequence[Path | str], journal_path: Path | None = None) -> None:
        self.files = [Path(f) for f in config_files]
        self.names = [display_path(f) for f in self.files]
        self.journal = Journal(journal_path) if journal_path is not None else None
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

    def documents(self) -> list[CommentedMap]:
        return [_load(text, name) for text, name in zip(self.base_texts(), self.names, strict=True)]

    def render(self, edits: Edits, *, verbatim: bool = True) -> dict[Path, str]:
        """The text of every config file with ``edits`` applied; nothing is written. A file
        none of whose values change is its text as found (see `patch_text`)."""
        for index in edits:
            if not 0 <= index < len(self.files):
                raise ConfigError(f"config file index {index} out of range (the target has {len(self.files)})")
        out: dict[Path, str] = {}
        for i, (f, text) in enumerate(zip(self.files, self.base_texts(), strict=True)):
            file_edits = edits.get(i, {})
            out[f] = patch_text(text, file_edits, self.names[i], verbatim=verbatim) if file_edits else text
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


# ---------------------------------------------------------------- round-trip patching


def patch_text(text: str, edits: Mapping[str, Any], name: str = "config", *, verbatim: bool = True) -> str:
    """``text`` with each dotted path set to its value; unknown paths are refused.

    A path whose value is already the one given is left alone (its node, and so its
    spelling, is kept), and with ``verbatim`` a text none of whose values change comes
    back as it is, byte for byte: the baseline writes exactly the file as found, and
    `tuner apply` never rewrites a key it does not change. ``verbatim=False`` dumps it
    through the round trip all the same (the preflight's can-we-write-it-back check)."""
    yaml, pristine = _parsed(text, name)
    # (an unknown path is MISSING, a change: refused below)
    if verbatim and all(_equal(get_path(pristine, dotted), value) for dotted, value in edits.items()):
        return text
    # A study renders the same base text every trial: guessing the indentation and
    # parsing cost ~7 ms of the ~10 ms render; a deep copy of the round-trip tree
    # (comments and formatting included) costs under 1 ms.
    doc = copy.deepcopy(pristine)
    for dotted, value in edits.items():
        _set(doc, dotted, value, name)
    buf = io.StringIO()
    with _DUMP_LOCK:  # the cached YAML instance holds emitter state while dumping
        yaml.dump(doc, buf)
    out = buf.getvalue()
    if "\r\n" in text:
        out = out.replace("\r\n", "\n").replace("\n", "\r\n")
    _self_check(out, doc, name)
    return out


_DUMP_LOCK = threading.Lock()


@functools.lru_cache(maxsize=16)
def _parsed(text: str, name: str) -> tuple[YAML, CommentedMap]:
    """The emitter settings and the round-trip tree of ``text``; callers deep-copy the
    tree before patching it (the cached one is never mutated)."""
    yaml = _yaml_for(text)
    return yaml, _load(text, name, yaml)


def _yaml_for(text: str) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold long lines the user kept on one line
    mapping, sequence, offset = _guess_indent(text)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    yaml.explicit_start = first.startswith("---")
    return yaml


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the file uses them; ruamel's defaults otherwise."""
    from ruamel.yaml.util import load_yaml_guess_indent

    mapping = None
    prev_key_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        lead = len(line) - len(line.lstrip(" "))
        if prev_key_indent is not None and lead > prev_key_indent and not stripped.startswith("- "):
            mapping = lead - prev_key_indent
            break
        prev_key_indent = lead if stripped.endswith(":") and not stripped.startswith("- ") else None
    try:
        _, seq_indent, offset = load_yaml_guess_indent(text)
    except YAMLError:
        seq_indent, offset = None, None
    mapping = mapping or 2
    if offset is None:
        return mapping, max(mapping, 2), 0
    return mapping, max(seq_indent or 2, offset + 2), offset


def _load(text: str, name: str, yaml: YAML | None = None) -> CommentedMap:
    try:
        doc = (yaml or YAML(typ="rt")).load(text)
    except YAMLError as exc:
        raise ConfigError(f"{name}: invalid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(doc, CommentedMap):
        raise ConfigError(f"{name}: expected a mapping at the top level")
    return doc


def _set(doc: CommentedMap, dotted: str, value: Any, name: str) -> None:
    segs = split_path(dotted)
    node: Any = doc
    for depth, seg in enumerate(segs[:-1]):
        child = get_path(node, str(seg))
        if child is MISSING or not isinstance(child, Mapping | list):
            walked = ".".join(str(s) for s in segs[: depth + 1])
            raise ConfigError(f"{name}: {dotted}: no such key {walked}{did_you_mean(dotted, all_paths(doc))}")
        node = child
    leaf = segs[-1]
    if isinstance(node, Mapping):
        key: Any = leaf if leaf in node else str(leaf)
        if key not in node:
            raise ConfigError(
                f"{name}: {dotted}: no such key{did_you_mean(dotted, all_paths(doc))} (only existing keys are patched)"
            )
    elif isinstance(node, list) and isinstance(leaf, int) and 0 <= leaf < len(node):
        key = leaf
    else:
        raise ConfigError(f"{name}: {dotted}: no such key{did_you_mean(dotted, all_paths(doc))}")
    node[key] = _merge(node[key], value, f"{name}: {dotted}")


def _merge(old: Any, new: Any, where: str) -> Any:
    """``new`` shaped like ``old``: containers updated in place, int/float and quoting kept,
    and a value equal to ``old`` left as ``old`` (``1.00`` stays ``1.00``)."""
    if _equal(old, new):
        return old
    if isinstance(old, CommentedSeq) and isinstance(new, Sequence) and not isinstance(new, str):
        items = [
            _merge(old[i], v, where) if i < len(old) else _scalar_like(old[-1] if old else None, v)
            for i, v in enumerate(new)
        ]
        old[:] = items
        return old
    if isinstance(old, CommentedMap) and isinstance(new, Mapping):
        for k, v in new.items():
            if k not in old:
                raise ConfigError(
                    f"{where}.{k}: no such key{did_you_mean(str(k), old)} (only existing keys are patched)"
                )
            old[k] = _merge(old[k], v, f"{where}.{k}")
        return old
    return _scalar_like(old, new)


def _equal(old: Any, new: Any) -> bool:
    """The config's ``old`` value is ``new`` as written: numbers by value (``1`` is ``1.0``,
    never ``True``), strings and bools by value and kind, containers item by item."""
    if old is MISSING:
        return False
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return old.keys() == new.keys() and all(_equal(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, Sequence) and not isinstance(new, str):
        return len(old) == len(new) and all(_equal(a, b) for a, b in zip(old, new, strict=True))
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool) and old == new
    if isinstance(old, int | float) and isinstance(new, int | float):
        return bool(old == new)
    if isinstance(old, str) and isinstance(new, str):
        return str(old) == new
    return old is None and new is None


def _scalar_like(old: Any, new: Any) -> Any:
    if isinstance(new, bool) or isinstance(old, bool):
        return new
    if isinstance(old, float) and isinstance(new, int):
        return float(new)
    if isinstance(old, int) and isinstance(new, float) and new.is_integer():
        return int(new)
    if isinstance(old, ScalarString) and isinstance(new, str):
        return type(old)(new)  # keep the user's quoting style
    return new


def _self_check(out: str, doc: CommentedMap, name: str) -> None:
    """The emitted text must parse back to exactly the patched document."""
    try:
        again = YAML(typ="safe", pure=True).load(out)
    except YAMLError as exc:  # pragma: no cover - would be a ruamel bug
        raise ConfigError(f"{name}: patched YAML does not parse ({exc}); the file was not written") from exc
    if again != to_plain(doc):  # pragma: no cover - would be a ruamel bug
        raise ConfigError(f"{name}: patched YAML does not read back as written; the file was not written")
