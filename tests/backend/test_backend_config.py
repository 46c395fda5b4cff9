"""Config validation: one line naming file:line, key and rule; refusal before binding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backend_testdata import write_corpus
from fusion_backend.config import load_config
from fusion_backend.errors import ConfigError
from support.backend import DEFAULT_CONFIG, free_port, write_backend_config


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus.jsonl")


def config_with(tmp_path: Path, corpus: Path, overrides: dict[str, Any]) -> Path:
    return write_backend_config(tmp_path / "config.yaml", corpus=corpus, overrides=overrides)


def test_committed_config_parses_with_its_documented_defaults(tmp_path: Path, corpus: Path) -> None:
    cfg = load_config(config_with(tmp_path, corpus, {}))
    assert cfg.fusion.method == "rrf" and cfg.fusion.rrf_k == 60
    assert cfg.fusion.weights == {"bm25": 1.0, "dense": 1.0}
    assert cfg.confidence.threshold == 0.0 and cfg.confidence.top_m == 3  # 0: no silent handoff by default
    assert cfg.fallback.windows_days == [30, 90]
    assert cfg.data.corpus == corpus and cfg.data.index_cache == tmp_path / "index-cache"


def test_relative_paths_resolve_against_the_config_directory(tmp_path: Path, corpus: Path) -> None:
    path = config_with(tmp_path, Path("corpus.jsonl"), {"data": {"index_cache": "cache"}})
    cfg = load_config(path)
    assert cfg.data.corpus == corpus and cfg.data.index_cache == tmp_path / "cache"


def test_hash_ignores_server_but_not_tuned_keys(tmp_path: Path, corpus: Path) -> None:
    base = load_config(config_with(tmp_path, corpus, {}))
    assert load_config(config_with(tmp_path, corpus, {"server": {"port": 9999}})).hash() == base.hash()
    assert load_config(config_with(tmp_path, corpus, {"fusion": {"rrf_k": 61}})).hash() != base.hash()


BAD = [
    ({"fusion": {"rrf_kk": 60}}, "fusion.rrf_kk", "unknown key (allowed here: method, rrf_k, weights, normalization, normalize_weights)"),
    ({"surprise": 1}, "surprise", "unknown key"),
    ({"sources": {"bm25": {"k3": 1}}}, "sources.bm25.k3", "unknown key (allowed here: enabled, depth, type, k1, b)"),
    ({"fusion": {"rrf_k": -1}}, "fusion.rrf_k", "greater than or equal to 0 (got -1)"),
    ({"fusion": {"method": "max"}}, "fusion.method", "'rrf' or 'linear' (got 'max')"),
    ({"fusion": {"normalization": "l2"}}, "fusion.normalization", "'minmax' or 'z'"),
    ({"fusion": {"weights": {"bm25": 1, "splade": 1}}}, "fusion.weights.splade", "names an unknown source (known: bm25, dense)"),
    ({"fusion": {"weights": {"bm25": -0.5}}}, "fusion.weights.bm25", "greater than or equal to 0"),
    ({"fusion": {"weights": {"bm25": 0, "dense": 0}}}, "fusion.weights", "must sum to more than 0"),
    ({"confidence": {"threshold": 1.5}}, "confidence.threshold", "less than or equal to 1"),
    ({"confidence": {"top_m": 0}}, "confidence.top_m", "greater than or equal to 1"),
    ({"citation": {"min_score": -0.1}}, "citation.min_score", "greater than or equal to 0"),
    ({"fallback": {"windows_days": [90, 30]}}, "fallback.windows_days", "must be strictly increasing"),
    ({"fallback": {"windows_days": [30, 30]}}, "fallback.windows_days", "must be strictly increasing"),
    ({"fallback": {"windows_days": [0, 30]}}, "fallback.windows_days.0", "greater than or equal to 1"),
    ({"recency": {"half_life_days": 0}}, "recency.half_life_days", "greater than 0"),
    ({"recency": {"weight": -1}}, "recency.weight", "greater than or equal to 0"),
    ({"sources": {"bm25": {"depth": 0}}}, "sources.bm25.depth", "greater than or equal to 1"),
    ({"sources": {"bm25": {"b": 2}}}, "sources.bm25.b", "less than or equal to 1"),
    ({"sources": {"dense": {"embedder": "word2vec"}}}, "sources.dense.embedder", "must be 'lsa' or 'sentence-transformers:"),
    ({"sources": {"dense": {"type": "sparse"}}}, "sources.dense", "type: bm25 | dense | run"),
    ({"sources": {"bm25": {"enabled": False}, "dense": {"enabled": False}}}, "sources", "at least one source"),
    ({"sources": {"dense2": {"type": "dense"}}}, "sources", "exactly one source must have type: dense"),
    ({"sources": {"splade": {"type": "run"}}}, "sources.splade", "set data.runs.splade or sources.splade.path"),
    ({"data": {"runs": {"bm25": "x.trec"}}}, "data.runs.bm25", "names no source with type: run"),
    ({"data": {"corpus": "missing.jsonl"}}, "data.corpus", "corpus file not found"),
]


@pytest.mark.parametrize(("overrides", "key", "rule"), BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_invalid_config_names_the_key_and_the_rule(tmp_path: Path, corpus: Path, overrides: dict[str, Any],
                                                   key: str, rule: str) -> None:
    path = config_with(tmp_path, corpus, overrides)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:")
    assert f": {key}: " in message
    assert rule in message


def test_message_points_at_the_offending_line(tmp_path: Path, corpus: Path) -> None:
    path = config_with(tmp_path, corpus, {"fusion": {"rrf_k": -3}})
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("rrf_k:"))
    with pytest.raises(ConfigError, match=rf"^{path}:{line}: fusion\.rrf_k: "):
        load_config(path)


def test_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  corpus: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: invalid YAML"):
        load_config(path)


def test_service_refuses_invalid_config_with_exit_2_and_one_stderr_line(tmp_path: Path, corpus: Path) -> None:
    path = config_with(tmp_path, corpus, {"fallback": {"windows_days": [90, 30]}})
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "fusion_backend", "serve", "--config", str(path), "--port", str(port)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fusion-backend: config error: {path}:")
    assert "fallback.windows_days: must be strictly increasing" in lines[0]


def test_committed_config_file_is_the_default_base() -> None:
    assert DEFAULT_CONFIG.name == "config.yaml" and DEFAULT_CONFIG.is_file()


def test_sentence_transformers_embedder_needs_the_package(tmp_path: Path, corpus: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("sentence_transformers") is not None:
        pytest.skip("sentence-transformers is installed here: the refusal cannot happen")
    path = config_with(tmp_path, corpus, {"sources": {"dense": {"embedder": "sentence-transformers:all-MiniLM-L6-v2"}}})
    with pytest.raises(ConfigError, match=r"sources\.dense\.embedder: .*needs the sentence-transformers package"):
        load_config(path)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_json_or_toml_config_file_loads_as_its_yaml_twin(tmp_path: Path, corpus: Path, suffix: str) -> None:
    import json

    import tomlkit
    from ruamel.yaml import YAML

    yaml_path = config_with(tmp_path, corpus, {"fusion": {"rrf_k": 7}})
    plain = json.loads(json.dumps(YAML(typ="safe", pure=True).load(yaml_path.read_text())))
    other = tmp_path / f"config{suffix}"
    other.write_text(json.dumps(plain, indent=2) + "\n" if suffix == ".json" else tomlkit.dumps(plain))
    assert load_config(other) == load_config(yaml_path)
    assert load_config(other).fusion.rrf_k == 7


def test_a_toml_syntax_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[fusion]\nrrf_k = = 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: invalid TOML: ") and "\n" not in str(err.value)
