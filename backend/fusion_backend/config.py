"""Typed config models, loading and validation.

The service reads ``config.yaml`` at start-up and again on each reload
(``POST /admin/reload``, SIGHUP). Any problem becomes one ``ConfigError`` line naming
the file, line, key and rule, so a tuner that wrote a bad value sees exactly which one;
the service then refuses to start (exit code 2), or a reload is refused (400).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError

SOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
ST_PREFIX = "sentence-transformers:"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Model):
    corpus: Path
    index_cache: Path = Path(".cache/index")
    runs: dict[str, Path] = Field(default_factory=dict)


class ServerConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class _SourceBase(_Model):
    enabled: bool = True
    depth: int = Field(100, ge=1, le=10_000)


class Bm25Source(_SourceBase):
    type: Literal["bm25"]
    k1: float = Field(1.5, ge=0.0, le=10.0)
    b: float = Field(0.75, ge=0.0, le=1.0)


class DenseSource(_SourceBase):
    type: Literal["dense"]
    embedder: str = "lsa"
    dims: int = Field(128, ge=2, le=2048)
    # A document is a dense candidate only when its cosine to the query is above this:
    # without a floor every window holds "hits" and the date fallback never moves on.
    min_similarity: float = Field(0.0, ge=0.0, lt=1.0)

    @field_validator("embedder")
    @classmethod
    def _known_embedder(cls, value: str) -> str:
        if value == "lsa":
            return value
        if value.startswith(ST_PREFIX) and len(value) > len(ST_PREFIX):
            if importlib.util.find_spec("sentence_transformers") is None:
                raise ValueError(
                    f"{value!r} needs the sentence-transformers package, which is not installed "
                    "(pip install sentence-transformers, or use embedder: lsa)"
                )
            return value
        raise ValueError(f"must be 'lsa' or 'sentence-transformers:<model name or path>' (got {value!r})")


class RunSource(_SourceBase):
    type: Literal["run"]
    path: Path | None = None  # else data.runs[<source name>]


SourceConfig = Annotated[Bm25Source | DenseSource | RunSource, Field(discriminator="type")]


class FusionConfig(_Model):
    method: Literal["rrf", "linear"] = "rrf"
    rrf_k: float = Field(60, ge=0, le=100_000)
    weights: dict[str, Annotated[float, Field(ge=0.0)]] = Field(default_factory=dict)
    normalization: Literal["minmax", "z"] = "minmax"
    # False: fused scores are not divided by the weight sum, so scaling every weight
    # scales every score (and what citation.min_score keeps), as in backends that add
    # weighted scores as they are. The tests use it to tell 1.0/1.0 from 0.5/0.5.
    normalize_weights: bool = True


class ConfidenceConfig(_Model):
    # 0: hand nothing off on confidence until tuned; any fixed default hands off a large
    # share of ordinary queries on some corpus (0.6: 46% of Cranfield's, docs/backend.md).
    threshold: float = Field(0.0, ge=0.0, le=1.0)
    top_m: int = Field(3, ge=1, le=1000)


class CitationConfig(_Model):
    min_score: float = Field(0.0, ge=0.0, le=1.0)


class FallbackConfig(_Model):
    windows_days: list[Annotated[int, Field(ge=1, le=100_000)]] = Field(default_factory=lambda: [30, 90])

    @field_validator("windows_days")
    @classmethod
    def _strictly_increasing(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"must be strictly increasing, e.g. [30, 90] (got {value})")
        return value


class RecencyConfig(_Model):
    half_life_days: float = Field(30, gt=0, le=100_000)
    weight: float = Field(0.0, ge=0.0, le=100.0)


class RerankConfig(_Model):
    # 0: off (the fused ranking as it is). Each of the top ``depth`` hits is re-read
    # (its title and text analysed again, as a cross-encoder reads each candidate), so
    # the time of a search grows with it: the latency side of a quality/latency trade-off.
    depth: int = Field(0, ge=0, le=100_000)
    weight: float = Field(0.5, ge=0.0, le=1.0)


class Config(_Model):
    """The whole effective config; paths are absolute after :func:`load_config`."""

    data: DataConfig
    server: ServerConfig = ServerConfig()
    sources: dict[str, SourceConfig]
    fusion: FusionConfig = FusionConfig()
    confidence: ConfidenceConfig = ConfidenceConfig()
    citation: CitationConfig = CitationConfig()
    fallback: FallbackConfig = FallbackConfig()
    recency: RecencyConfig = RecencyConfig()
    rerank: RerankConfig = RerankConfig()

    def enabled_sources(self) -> dict[str, SourceConfig]:
        return {name: src for name, src in self.sources.items() if src.enabled}

    def weight(self, source: str) -> float:
        """A source missing from ``fusion.weights`` weighs 1.0."""
        return self.fusion.weights.get(source, 1.0)

    def dense_source(self) -> tuple[str, DenseSource]:
        return next((n, s) for n, s in self.sources.items() if isinstance(s, DenseSource))

    def run_path(self, name: str) -> Path:
        src = self.sources[name]
        assert isinstance(src, RunSource)
        return src.path if src.path is not None else self.data.runs[name]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def hash(self) -> str:
        """sha256 of the effective config minus ``server`` (host/port do not change results)."""
        body = {k: v for k, v in self.to_json().items() if k != "server"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def load_config(path: Path, *, host: str | None = None, port: int | None = None) -> Config:
    """Parse, validate and resolve ``path``; raise one-line ``ConfigError`` on any problem."""
    return read_config(path, host=host, port=port)[0]


def read_config(path: Path, *, host: str | None = None, port: int | None = None) -> tuple[Config, str]:
    """:func:`load_config` plus the sha256 hex digest of the exact bytes it parsed (the
    file is read once: the digest always describes the config returned)."""
    path = Path(path).resolve()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        # As read_text(encoding="utf-8") would: universal newlines.
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config file is not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    return _parse_config(path, text, host, port), hashlib.sha256(data).hexdigest()


def _parse_config(path: Path, text: str, host: str | None, port: int | None) -> Config:
    # The file's format is its suffix's: TOML by the standard library; YAML otherwise
    # (a JSON file is YAML too, and keeps its line numbers in errors that way).
    raw = _parse_toml(path, text) if path.suffix.lower() == ".toml" else _parse_yaml(path, text)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping with keys data, sources, fusion, ...")
    return _validated(raw, path.parent, lambda loc: f"{path}:{_line_of(raw, loc)}", host, port)


def config_from_json(doc: Any, where: str, base: Path, *, host: str | None = None, port: int | None = None) -> Config:
    """A config given as a JSON document (``PUT /admin/config``, the config store),
    validated by exactly the rules a config file gets: one ``ConfigError`` line
    ``<where>: <key>: <rule>``. Relative paths resolve against ``base``."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the config must be a JSON object with keys data, sources, fusion, ...")
    return _validated(doc, base, lambda loc: where, host, port)


# What a request may override (``POST /search``'s ``overrides``): everything that only
# changes how the candidates already retrieved are cut, combined and gated. The rest
# (data.*, server.*, a source's type and index parameters, which sources exist) shapes
# the index or the socket, which only a reload or PUT /admin/config may change.
REQUEST_SECTIONS = ("fusion", "confidence", "citation", "fallback", "recency")
REQUEST_SOURCE_KEYS = {"bm25": ("depth",), "dense": ("depth", "min_similarity", "enabled"), "run": ("depth",)}


def with_overrides(cfg: Config, overrides: dict[str, Any], where: str = "overrides") -> Config:
    """``cfg`` with ``overrides`` (a partial config, same keys) deep-merged over it,
    validated by the config file's rules; ``ConfigError`` (one line naming the key)
    for a bad value or a key that cannot be set per request."""
    for key, value in overrides.items():
        if key == "sources" and isinstance(value, dict):
            for name, fields in value.items():
                src = cfg.sources.get(name)
                if src is None:
                    raise ConfigError(
                        f"{where}: sources.{name}: names no served source (served: {', '.join(cfg.sources)}); "
                        "sources cannot be added per request"
                    )
                allowed = REQUEST_SOURCE_KEYS[src.type]
                for field in fields if isinstance(fields, dict) else [None]:
                    if field not in allowed:
                        dotted = f"sources.{name}" + (f".{field}" if field is not None else "")
                        raise ConfigError(
                            f"{where}: {dotted}: cannot be set per request (it changes the index; "
                            f"per request: sources.{name}.{{{', '.join(allowed)}}}); change it with "
                            "PUT /admin/config or the config file and a reload"
                        )
        elif key not in REQUEST_SECTIONS and key in Config.model_fields:
            raise ConfigError(
                f"{where}: {key}: cannot be set per request (per request: {', '.join(REQUEST_SECTIONS)}, "
                f"sources.<name>.depth / min_similarity); change it with PUT /admin/config or the config "
                "file and a reload"
            )
    merged = deep_merge(cfg.to_json(), overrides)
    return _validated(merged, cfg.data.corpus.parent, lambda loc: where, None, None)


def deep_merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in layer.items():
        old = out.get(key)
        out[key] = deep_merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _validated(
    raw: dict[str, Any], base: Path, where: Callable[[tuple[Any, ...]], str], host: str | None, port: int | None
) -> Config:
    plain = json.loads(json.dumps(raw, default=str))  # ruamel's comment-carrying types -> plain
    try:
        cfg = Config.model_validate(plain)
    except ValidationError as exc:
        raise ConfigError(_describe(where, raw, exc.errors()[0])) from exc
    cfg = _resolve_paths(cfg, base)
    if host is not None or port is not None:
        overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
        try:
            server = ServerConfig.model_validate({**cfg.server.model_dump(), **overrides})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError(f"--{err['loc'][0]}: {err['msg']} (got {err['input']!r})") from exc
        cfg = cfg.model_copy(update={"server": server})
    problem = _cross_check(cfg)
    if problem is not None:
        loc, rule = problem
        raise ConfigError(f"{where(loc)}: {'.'.join(map(str, loc))}: {rule}")
    return cfg


def _parse_yaml(path: Path, text: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="rt").load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from exc


def _parse_toml(path: Path, text: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {str(exc).splitlines()[0]}") from exc


def _resolve_paths(cfg: Config, base: Path) -> Config:
    def res(p: Path) -> Path:
        return (base / p).resolve() if not p.is_absolute() else p

    data = cfg.data.model_copy(
        update={
            "corpus": res(cfg.data.corpus),
            "index_cache": res(cfg.data.index_cache),
            "runs": {k: res(v) for k, v in cfg.data.runs.items()},
        }
    )
    sources = {
        n: s.model_copy(update={"path": res(s.path)}) if isinstance(s, RunSource) and s.path else s
        for n, s in cfg.sources.items()
    }
    return cfg.model_copy(update={"data": data, "sources": sources})


def _cross_check(cfg: Config) -> tuple[tuple[str, ...], str] | None:
    """Rules spanning sections; returns (key path, rule) of the first violation."""
    names = list(cfg.sources)
    for name in names:
        if not SOURCE_NAME.match(name):
            return ("sources", name), "source names must match [A-Za-z][A-Za-z0-9_-]*"
    dense = [n for n, s in cfg.sources.items() if isinstance(s, DenseSource)]
    if len(dense) != 1:
        return ("sources",), (
            f"exactly one source must have type: dense (it provides the confidence space; "
            f"it may be enabled: false); found {len(dense)}"
        )
    if not cfg.enabled_sources():
        return ("sources",), "at least one source must be enabled: true"
    for name in cfg.fusion.weights:
        if name not in cfg.sources:
            return ("fusion", "weights", name), f"names an unknown source (known: {', '.join(names)})"
    if sum(cfg.weight(n) for n in cfg.enabled_sources()) <= 0:
        return ("fusion", "weights"), "the weights of the enabled sources must sum to more than 0"
    for name in cfg.data.runs:
        if not isinstance(cfg.sources.get(name), RunSource):
            return ("data", "runs", name), f"names no source with type: run (add sources.{name}: {{type: run}})"
    for name, src in cfg.sources.items():
        if isinstance(src, RunSource):
            if src.path is not None and name in cfg.data.runs:
                return ("sources", name, "path"), f"set either sources.{name}.path or data.runs.{name}, not both"
            if src.path is None and name not in cfg.data.runs:
                return ("sources", name), (
                    f"a run source needs a TREC run file: set data.runs.{name} or sources.{name}.path"
                )
            if src.enabled and not cfg.run_path(name).is_file():
                key = ("sources", name, "path") if src.path is not None else ("data", "runs", name)
                return key, f"run file not found: {cfg.run_path(name)}"
    if not cfg.data.corpus.is_file():
        return ("data", "corpus"), (
            f"corpus file not found: {cfg.data.corpus} (write one with "
            "`python -m fusion_backend.datagen demo --out DIR` or an importer, then point data.corpus at it)"
        )
    return None


def _describe(where: Callable[[tuple[Any, ...]], str], raw: Any, err: Any) -> str:
    loc = _strip_tags(tuple(err["loc"]))
    key = ".".join(map(str, loc)) or "<root>"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        rule = f"unknown key (allowed here: {', '.join(_allowed_keys(raw, loc[:-1]))})"
    elif kind == "missing":
        rule = "required key is missing"
    elif kind == "union_tag_invalid" or kind == "union_tag_not_found":
        rule = "sources need type: bm25 | dense | run"
    else:
        rule = msg.removeprefix("Value error, ")
        if "input" in err and kind != "value_error" and not isinstance(err["input"], dict):
            rule += f" (got {err['input']!r})"
    return f"{where(loc)}: {key}: {rule}"


def _strip_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic puts the discriminator value into the location of a tagged union:
    # ('sources', 'dense', 'dense', 'dims') -> ('sources', 'dense', 'dims').
    if len(loc) >= 3 and loc[0] == "sources" and loc[2] in ("bm25", "dense", "run"):
        return loc[:2] + loc[3:]
    return loc


def _allowed_keys(raw: Any, parent: tuple[Any, ...]) -> list[str]:
    model: Any = Config
    if len(parent) == 2 and parent[0] == "sources":
        kind = (raw.get("sources") or {}).get(parent[1], {}).get("type")
        model = {"bm25": Bm25Source, "dense": DenseSource, "run": RunSource}.get(kind, _SourceBase)
    else:
        for part in parent:
            model = model.model_fields[part].annotation
    return list(model.model_fields)


def _line_of(raw: Any, loc: tuple[Any, ...]) -> int:
    """1-based line of the deepest key of ``loc`` found in the round-trip YAML (1 if none)."""
    line, node = 0, raw
    for part in loc:
        lc = getattr(node, "lc", None)
        if not isinstance(node, dict) or part not in node or lc is None:
            break
        line = lc.key(part)[0]
        node = node[part]
    return line + 1
