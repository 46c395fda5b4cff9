"""The SMART record format of the classic test collections (Cranfield, CACM).

A record starts with ``.I <id>``; each field starts with a marker line ``.X`` (one
capital letter alone on its line) and runs until the next marker. Body text can
start with a dot too (".5 mach number"), so only the markers a collection declares
count as markers; an undeclared marker-looking line is reported, not swallowed.
A declared marker that repeats a field the record already has is body text of the
current field: cran.all.1400 record 240 has stray ".A" and ".B" lines inside its
abstract. An id can wrap onto the next line: cacm.all has ".I 28" then "56" for
record 2856, so digits alone right after the ``.I`` line continue the id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DataFormatError
from .textfile import read_lines

_ID_LINE = re.compile(r"^\.I\s+(\S+)\s*$")
_MARKER = re.compile(r"^\.([A-Z])\s*$")


@dataclass
class SmartRecord:
    """One record: its ``.I`` id, the line it starts on, and its fields' raw text."""

    record_id: str
    line: int
    fields: dict[str, str] = field(default_factory=dict)
    field_lines: dict[str, int] = field(default_factory=dict)

    def text(self, marker: str) -> str:
        """The field's words joined by single spaces ('' when the field is absent)."""
        return " ".join(self.fields.get(marker, "").split())


def parse_smart(path: Path, markers: str) -> list[SmartRecord]:
    """Parse ``path``; ``markers`` lists the field letters the collection uses (e.g. "TABW")."""
    records: list[SmartRecord] = []
    current: SmartRecord | None = None
    field_name: str | None = None
    lines: list[str] = []

    def close_field() -> None:
        if current is not None and field_name is not None:
            current.fields[field_name] = "\n".join(lines).strip()

    for number, line in enumerate(read_lines(path), start=1):
        id_match = _ID_LINE.match(line)
        if id_match:
            close_field()
            current = SmartRecord(id_match.group(1), number)
            records.append(current)
            field_name, lines = None, []
            continue
        marker = _MARKER.match(line)
        repeated = marker is not None and current is not None and marker.group(1) in current.fields
        if marker and marker.group(1) in markers and not repeated:
            if current is None:
                raise DataFormatError.at(
                    path,
                    number,
                    f"field '.{marker.group(1)}' before the first '.I' line",
                    "every record must start with '.I <id>'",
                )
            close_field()
            field_name, lines = marker.group(1), []
            current.field_lines[field_name] = number
            continue
        if marker and not repeated:
            raise DataFormatError.at(
                path,
                number,
                f"unknown field marker '.{marker.group(1)}'",
                f"this collection's markers are {', '.join('.' + m for m in markers)}; remove or rename the line",
            )
        if current is None:
            if line.strip():
                raise DataFormatError.at(
                    path,
                    number,
                    "text before the first '.I' line",
                    "remove the stray text or add the missing '.I <id>' line",
                )
            continue
        if field_name is None:
            if line.strip().isdigit() and not current.fields:
                current.record_id += line.strip()
                continue
            if line.strip():
                raise DataFormatError.at(
                    path,
                    number,
                    f"text in record {current.record_id} before any field marker",
                    "add the field marker line (e.g. '.W') above it",
                )
            continue
        lines.append(line)
    close_field()
    _check_unique(path, records)
    return records


def _check_unique(path: Path, records: list[SmartRecord]) -> None:
    seen: dict[str, int] = {}
    for record in records:
        if record.record_id in seen:
            raise DataFormatError.at(
                path,
                record.line,
                f"record id {record.record_id} already used on line {seen[record.record_id]}",
                "give every '.I' record a distinct id",
            )
        seen[record.record_id] = record.line
