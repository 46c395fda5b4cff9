"""Reading raw collection files: any line ending, one error for a missing file.

Old test collections mix CRLF and LF (Cranfield's cranqrel, for one) and are not
always valid UTF-8, so lines are split on LF and a trailing CR is dropped, and
undecodable bytes fall back to Latin-1 rather than failing the import.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DataFormatError


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataFormatError.at(path, None, "file not found", "check the path given on the command line") from exc
    except OSError as exc:
        raise DataFormatError.at(
            path, None, f"cannot read the file ({exc.strerror})", "check the path and its permissions"
        ) from exc
    if path.suffix == ".gz":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataFormatError.at(
                path, None, "not a valid gzip file", "decompress it or pass the uncompressed file"
            ) from exc
    return raw


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def split_lines(text: str) -> list[str]:
    """Lines without their terminator, whether it was LF or CRLF (and no phantom last line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: Path) -> list[str]:
    return split_lines(decode(read_bytes(path)))


def require_file(directory: Path, name: str, option: str = "--src") -> Path:
    path = directory / name
    if not path.is_file():
        raise DataFormatError.at(
            path, None, f"expected file {name!r} is missing", f"point {option} at the directory that holds {name}"
        )
    return path


# ---------------------------------------------------------------- record files (JSONL, TSV)


def split_rows(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number from 1, whitespace-separated columns) of every non-blank line:
    the loop of the column formats (TREC qrels and runs)."""
    for number, line in enumerate(lines, start=1):
        parts = line.split()
        if parts:
            yield number, parts


def first_char(lines: list[str]) -> str:
    """The first non-blank character of a file: ``{`` JSONL, ``[`` a JSON array, else columns."""
    return next((line for line in lines if line.strip()), "").lstrip()[:1]


def json_object(path: Path, number: int, line: str, fix: str) -> dict[str, Any]:
    """One JSONL line as an object, or the located error with ``fix``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataFormatError.at(path, number, f"invalid JSON ({exc.msg})", fix) from exc
    if not isinstance(record, dict):
        raise DataFormatError.at(path, number, "not a JSON object", fix)
    return record


def first_value(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` the record fills (None and "" count as unfilled)."""
    return next((record[k] for k in keys if record.get(k) not in (None, "")), None)


def is_int(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()
