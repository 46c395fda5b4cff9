"""Reading a search-space file: the YAML document's schema (:class:`SpaceFile`), each
param's config file resolved, then :func:`load_space` -> SearchSpace.

The format is described in tuner/config/space/__init__.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.config.space.checks import check_conditions
from tuner.config.space.kind import ParamKind
from tuner.config.space.params import Param, ParamSpec
from tuner.config.space.scalars import FixedParam
from tuner.config.space.searchspace import SearchSpace
from tuner.config.yamlfile import line_of, load_model, read_yaml
from tuner.errors import ConfigError
from tuner.files import display_path


class SpaceFile(BaseModel):
    """The YAML document of a search-space file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str | None = None
    file: int | str = 0
    params: dict[str, Param] = Field(default_factory=dict)
    fixed: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_overlap(self) -> SpaceFile:
        both = sorted(set(self.params) & set(self.fixed))
        if both:
            raise ValueError(f"{both[0]} is both tuned (params) and fixed (remove one)")
        if not self.params and not self.fixed:
            raise ValueError("the space has no params (add at least one under params:)")
        return self


def load_space(path: Path | str, config_files: Sequence[Path | str] = ()) -> SearchSpace:
    """Read and validate a search-space file.

    ``config_files`` (the experiment's ``target.config_files``) lets params name their
    file by path (``file: backend/config.yaml``); a path matches a config file when it
    is that file or a trailing part of its path. Integer ``file`` indexes the list.
    """
    path = Path(path)
    doc = read_yaml(path)
    model = load_model(path, SpaceFile, data=doc)
    files = [Path(f) for f in config_files]
    specs: list[ParamSpec] = []
    entries: list[tuple[str, ParamKind, tuple[str, ...]]] = [(n, s, ("params", n)) for n, s in model.params.items()]
    entries += [(n, FixedParam(type="fixed", value=v), ("fixed", n)) for n, v in model.fixed.items()]
    for name, spec, loc in entries:
        line = line_of(doc, loc)
        where = display_path(path) + (f":{line}" if line else "")
        ref = spec.file if spec.file is not None else model.file
        try:
            index = _resolve_file(ref, files, path.parent)
        except ValueError as exc:
            raise ConfigError(f"{where}: {name}: {exc}") from None
        specs.append(ParamSpec(name=name, path=spec.path or name, file=index, spec=spec, line=line))
    check_conditions(path, specs)
    return SearchSpace(path, specs)


def _resolve_file(ref: int | str, files: Sequence[Path], base: Path) -> int:
    if isinstance(ref, int):
        if ref < 0 or (files and ref >= len(files)):
            raise ValueError(f"file: {ref} is out of range (the target has {len(files)} config file(s))")
        return ref
    wanted = Path(ref)
    if not files:
        raise ValueError(f"file: {ref} needs the experiment's target.config_files to resolve (or use an index)")
    for i, f in enumerate(files):
        if (base / wanted).resolve() == f.resolve() or f.parts[-len(wanted.parts) :] == wanted.parts:
            return i
    raise ValueError(f"file: {ref} matches none of target.config_files {[str(f) for f in files]}")
