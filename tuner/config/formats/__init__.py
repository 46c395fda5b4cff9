"""Config file formats, chosen by a file's suffix: one small module per format.

    .yaml / .yml -> yaml_format   comments, key order, indentation, quoting, flow style
    .json        -> json_format   key order, indentation, spacing, escapes: only edited values' text changes
    .toml        -> toml_format   comments, key order, tables, layout (tomlkit)

Each module offers the same two functions (``ConfigFormat``)::

    load(text, name) -> mapping          # the parsed document (for values and paths)
    patch(text, edits, name, verbatim=True) -> str

``edits`` maps a dotted path (list indices as numeric segments: ``fusion.windows_days.1``)
to its new value; only existing keys are patched, and every patch re-parses its output and
compares the edited values before it is returned (a one-line ConfigError naming the file
and the key otherwise). Writing (atomic, owner and mode kept) is tuner.files' job.

    format_for(path) -> ConfigFormat     # ConfigError naming the supported suffixes
    check_suffix(path) -> str | None     # the same, as a message (for validators)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.config.formats import json_format, toml_format, yaml_format
from tuner.errors import ConfigError


@dataclass(frozen=True)
class ConfigFormat:
    kind: str  # "YAML", "JSON", "TOML"
    load: Callable[[str, str], Any]
    patch: Callable[..., str]  # (text, edits, name, *, verbatim=True) -> str


YAML = ConfigFormat(yaml_format.KIND, yaml_format.load, yaml_format.patch)
JSON = ConfigFormat(json_format.KIND, json_format.load, json_format.patch)
TOML = ConfigFormat(toml_format.KIND, toml_format.load, toml_format.patch)

BY_SUFFIX: dict[str, ConfigFormat] = {".yaml": YAML, ".yml": YAML, ".json": JSON, ".toml": TOML}


def check_suffix(path: Path | str) -> str | None:
    """None when ``path``'s suffix names a supported format; else what is wrong, in one line."""
    suffix = Path(path).suffix.lower()
    if suffix in BY_SUFFIX:
        return None
    shown = f"suffix {suffix!r}" if suffix else "no suffix"
    return (
        f"{Path(path).name}: {shown}: a config file must be YAML, JSON or TOML, named by its suffix "
        f"({', '.join(BY_SUFFIX)}); rename the file or point config_files at one"
    )


def format_for(path: Path | str) -> ConfigFormat:
    """The format of a config file, by its suffix (case-insensitive)."""
    problem = check_suffix(path)
    if problem is not None:
        raise ConfigError(problem)
    return BY_SUFFIX[Path(path).suffix.lower()]
