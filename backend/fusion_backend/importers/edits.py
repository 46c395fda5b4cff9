"""Ready files edited since the last import: found before a re-import writes, refused or backed up.

The ready files (ready.py: ``config.yaml``, ``space.yaml``, ``experiment.yaml``,
``experiment_replay.yaml``) are written to be edited: ``tuner apply`` writes the best
trial's values into ``config.yaml``, people narrow ``space.yaml`` and point the
experiments at their own service. All four are guarded, since a re-import that quietly
put the defaults back would serve or tune something nobody meant. Every import
records the sha256 of each ready file it wrote in ``manifest.json``
(``ready_files_sha256``); the next import compares each file on disk with it:

* as the last import wrote it, already what this import writes, or gone: written;
* otherwise the import stops before writing anything, naming the file and what
  overwriting it would change; ``--force`` first copies it to
  ``OUT/.import-backups/<UTC time>/`` and then writes.

A file with no recorded sha256 (a bundle imported before the record existed, or a
folder the importer did not write) is not overwritten either unless it already is what
this import writes: nothing shows it is the importer's.

The data files (corpus, query set, qrels, runs, manifest) are the importer's own and
always rewritten. ``.tuner/`` (study, labels, journal) and ``mlruns/`` are never read
or written: the bundle writer only writes the files it names.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .dataset import MANIFEST_FILE
from .errors import DataFormatError

RECORD_KEY = "ready_files_sha256"
BACKUP_DIR = ".import-backups"
_SHOWN_KEYS = 4  # changed keys named in the error line; the rest are counted
_SHOWN_VALUE = 40  # characters of one value shown


@dataclass(frozen=True)
class Edited:
    """A ready file on disk that is neither the last import's nor this import's text."""

    name: str
    recorded: bool  # the last import's sha256 of it is in the manifest
    changes: str  # what overwriting it would change, as people read it


def record(ready: Mapping[str, str]) -> dict[str, str]:
    """The manifest entry: ready file name -> sha256 of the text written (UTF-8, as the writer writes it)."""
    return {name: _sha256(text.encode("utf-8")) for name, text in ready.items()}


def find_edited(out_dir: Path, ready: Mapping[str, str]) -> list[Edited]:
    """The ready files an import into ``out_dir`` would overwrite although they were edited."""
    recorded = _recorded(out_dir)
    edited = []
    for name, text in ready.items():
        path = out_dir / name
        try:
            on_disk = path.read_bytes()
        except FileNotFoundError:
            continue  # removed by hand: nothing to lose
        except OSError as exc:
            raise DataFormatError.at(
                path,
                None,
                f"cannot read it to check for edits ({exc.strerror})",
                "make it readable, or choose another --out",
            ) from exc
        new = text.encode("utf-8")
        if on_disk == new or recorded.get(name) == _sha256(on_disk):
            continue
        edited.append(Edited(name, name in recorded, describe_changes(on_disk, text)))
    return edited


def refusal(out_dir: Path, edited: list[Edited]) -> DataFormatError:
    """The one-line stop: which files, what overwriting them would change, and ``--force``."""
    where = ", ".join(str(out_dir / e.name) for e in edited)
    changes = edited[0].changes if len(edited) == 1 else "; ".join(f"in {e.name} {e.changes}" for e in edited)
    unrecorded = [e.name for e in edited if not e.recorded]
    why = "edited since the last import"
    if unrecorded:
        why = (
            ("" if len(unrecorded) == len(edited) else why + ", or ")
            + f"not recorded as the importer's ({MANIFEST_FILE} holds no sha256 of {', '.join(unrecorded)}: an "
            "import older than that record, or a file the importer did not write)"
        )
    them = "it" if len(edited) == 1 else "them"
    files = "the edited file is" if len(edited) == 1 else "the edited files are"
    return DataFormatError.at(
        where,
        None,
        f"{why}; overwriting {them} would change {changes}; nothing was written",
        f"pass --force to overwrite {them} ({files} first copied to "
        f"{out_dir / BACKUP_DIR}/<UTC time>/), or import into another --out",
    )


def back_up(out_dir: Path, edited: list[Edited], now: datetime | None = None) -> Path:
    """Copy the edited files (mode and times kept) into a new ``OUT/.import-backups/<UTC time>/``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = out_dir / BACKUP_DIR
    try:
        folder = _new_folder(base, stamp)
        for e in edited:
            shutil.copy2(out_dir / e.name, folder / e.name)
    except OSError as exc:
        raise DataFormatError.at(
            base,
            None,
            f"cannot back up the edited files ({exc.strerror}); nothing was overwritten",
            "make the folder writable, or import into another --out",
        ) from exc
    return folder


def _new_folder(base: Path, stamp: str) -> Path:
    """``base/stamp``, or ``stamp-2``, ``-3``... when a forced import in the same second made it."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}/{stamp}-*")


def describe_changes(on_disk: bytes, new_text: str) -> str:
    """What writing ``new_text`` over ``on_disk`` changes, by dotted YAML key: ``fusion.rrf_k 167 -> 60``."""
    try:
        old = _flat(_load(on_disk.decode("utf-8")))
        new = _flat(_load(new_text))
    except (UnicodeDecodeError, ValueError):
        return "text that is not valid YAML now (no key compared)"
    # Values changed first (an applied config's), then keys removed, then keys added.
    keys = [
        *(k for k in new if k in old and old[k] != new[k]),
        *(k for k in old if k not in new),
        *(k for k in new if k not in old),
    ]
    if not keys:
        return "comments or layout only (no value differs)"
    shown = ", ".join(f"{k} {_show(old.get(k, _GONE))} -> {_show(new.get(k, _GONE))}" for k in keys[:_SHOWN_KEYS])
    more = len(keys) - _SHOWN_KEYS
    return shown + (f" and {more} more key{'s' if more > 1 else ''}" if more > 0 else "")


_GONE = object()  # a key one side does not have


def _load(text: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise ValueError(str(exc)) from exc


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value; mappings are walked, lists and scalars are values."""
    if not isinstance(doc, dict):
        return {prefix or "(document)": doc}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flat(value, dotted) if isinstance(value, dict) and value else {dotted: value})
    return out


def _show(value: Any) -> str:
    if value is _GONE:
        return "(none)"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _SHOWN_VALUE else text[: _SHOWN_VALUE - 3] + "..."


def _recorded(out_dir: Path) -> dict[str, str]:
    """The last import's sha256 per ready file; empty when the manifest is missing, unreadable or older."""
    try:
        manifest = json.loads((out_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    entry = manifest.get(RECORD_KEY) if isinstance(manifest, dict) else None
    if not isinstance(entry, dict):
        return {}
    return {str(k): v for k, v in entry.items() if isinstance(v, str)}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
