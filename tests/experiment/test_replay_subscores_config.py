"""The ``replay.subscores`` mapping (tuner.config.replay): an engine's per-hit sub-scores
declared per source, checked when the experiment file is read, each mistake one line
with the file, the line and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tuner.config.replay import ReplayConfig, role_kinds, weight_source
from tuner.config.strict import StrictModel
from tuner.config.yamlfile import load_model
from tuner.errors import ConfigError


class _File(StrictModel):
    replay: ReplayConfig


AZURE = """\
replay:
  params: {fusion.weights.dense: weight:dense}
  request: {debug: vector, top: 1000}
  subscores:
    limit: top
    sources:
      text: {score: '@search\\.documentDebugInfo.vectors.subscores.text.searchScore'}
      dense: {score: '@search\\.documentDebugInfo.vectors.subscores.vectors.0.dense.searchScore'}
    fusion: {method: rrf, rrf_k: 60, combine: sum}
"""


def _load(tmp_path: Path, text: str) -> ReplayConfig:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    return load_model(path, _File).replay


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, text)
    message = str(exc.value)
    assert "\n" not in message
    assert "exp.yaml:" in message
    return message


def test_the_azure_mapping_reads_as_declared(tmp_path: Path) -> None:
    replay = _load(tmp_path, AZURE)
    sub = replay.subscores
    assert sub is not None
    assert sub.limit == "top"
    # the escaped dot keeps "@search.documentDebugInfo" one key; the rest is a path below it
    assert sub.sources["text"].score == "@search\\.documentDebugInfo.vectors.subscores.text.searchScore"
    assert sub.sources["dense"].rank is None
    assert (sub.fusion.method, sub.fusion.rrf_k, sub.fusion.combine, sub.fusion.weights) == ("rrf", 60.0, "sum", {})
    assert list(sub.sources) == ["text", "dense"]  # the engine's source order, as declared
    assert replay.params == {"fusion.weights.dense": "weight:dense"}
    assert weight_source("weight:dense") == "dense" and weight_source("weights") is None
    assert role_kinds("weight:dense") == ("float", "int")


def test_a_source_may_be_read_by_rank_alone_for_rrf(tmp_path: Path) -> None:
    text = AZURE.replace("{score: '@search\\.documentDebugInfo.vectors.subscores.text.searchScore'}",
                         "{rank: _explanation.text_rank}")
    sub = _load(tmp_path, text).subscores
    assert sub is not None and (sub.sources["text"].score, sub.sources["text"].rank) == (None, "_explanation.text_rank")


def test_a_malformed_path_is_refused_naming_the_source(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("vectors.0.dense.searchScore", "vectors..dense.searchScore"))
    assert "replay.subscores.sources.dense.score" in message and "empty key" in message


def test_a_source_without_score_or_rank_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace(
        "{score: '@search\\.documentDebugInfo.vectors.subscores.text.searchScore'}", "{}"))
    assert "replay.subscores.sources.text" in message and "give score:" in message


def test_a_weight_role_must_name_a_declared_source(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("weight:dense}", "weight:vector}"))
    assert "role weight:vector weighs 'vector', not among subscores.sources ['dense', 'text']" in message


def test_an_unknown_role_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("weight:dense}", "weigth:dense}"))
    assert "role 'weigth:dense' is not one of" in message and "weight:<source>" in message


def test_sub_scores_need_the_request_fields_that_ask_for_them(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("  request: {debug: vector, top: 1000}\n", ""))
    assert "subscores needs request:" in message and "debug: vector" in message


def test_a_linear_fusion_needs_every_source_score(tmp_path: Path) -> None:
    text = AZURE.replace("{score: '@search\\.documentDebugInfo.vectors.subscores.text.searchScore'}",
                         "{rank: r.text}").replace("method: rrf", "method: linear")
    message = _refused(tmp_path, text)
    assert "fusion.method linear fuses scores, but sources ['text'] give a rank only" in message


def test_a_fixed_weight_must_be_above_zero_and_name_a_source(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("combine: sum}", "combine: sum, weights: {text: 0}}"))
    assert "a weight must be above 0" in message
    message = _refused(tmp_path, AZURE.replace("combine: sum}", "combine: sum, weights: {bm25: 1.0}}"))
    assert "fusion.weights names ['bm25'], not among sources" in message


def test_an_unknown_key_in_the_mapping_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, AZURE.replace("limit: top", "limt: top"))
    assert "replay.subscores.limt" in message
