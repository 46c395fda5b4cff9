"""Reading raw collection files: any line ending, one error for a missing file.

Old test collections mix CRLF and LF (Cranfield's cranqrel, for one) and are not
always valid UTF-8, so lines are split on LF and a trailing CR is dropped, and
undecodable bytes fall back to Latin-1 rather than failing the import.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from .errors import DataFormatError


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataFormatError.at(path, None, "file not found",
                                 "check the path given on the command line") from exc
    except OSError as exc:
        raise DataFormatError.at(path, None, f"cannot read the file ({exc.strerror})",
                                 "check the path and its permissions") from exc
    if path.suffix == ".gz":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataFormatError.at(path, None, "not a valid gzip file",
                                     "decompress it or pass the uncompressed file") from exc
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
        raise DataFormatError.at(path, None, f"expected file {name!r} is missing",
                                 f"point {option} at the directory that holds {name}")
    return path
