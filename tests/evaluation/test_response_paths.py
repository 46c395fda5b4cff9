"""Response paths with a dot inside a key (tuner.evaluation.paths): Azure AI Search
answers ``@search.score``, which a plain dotted path cannot name. ``\\.`` is a dot
inside a key; every path without a backslash keeps its meaning; a malformed path is
refused with one line when the config is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tuner.config.yamlfile import load_model
from tuner.errors import ConfigError
from tuner.evaluation import mapping as mapping_mod
from tuner.evaluation.answers import AnswerDecoder
from tuner.evaluation.mapping import Hit, parse_response, resolve_path
from tuner.evaluation.paths import split_path
from tuner.evaluation.spec import EvalSpec, ResponseMapping

AZURE = {"value": [{"@search.score": 0.033, "id": "d7", "title": "Seven"},
                   {"@search.score": 0.016, "id": "d2", "title": "Two"}],
         "@odata.count": 2}


@pytest.mark.parametrize(("path", "keys"), [
    ("results", ("results",)),
    ("data.hits", ("data", "hits")),
    ("data.0.hits", ("data", "0", "hits")),
    (r"@search\.score", ("@search.score",)),
    (r"hit.@search\.score", ("hit", "@search.score")),
    (r"a\\.b", ("a\\", "b")),
    (r"a\\\.b", ("a\\.b",)),
    ("@title", ("@title",)),
])
def test_paths_split_into_keys(path: str, keys: tuple[str, ...]) -> None:
    assert split_path(path) == keys


@pytest.mark.parametrize("path", [r"a\b", "score\\", "a..b", ".a", "a.", ""])
def test_a_malformed_path_is_one_line_config_error(path: str) -> None:
    with pytest.raises(ConfigError) as err:
        split_path(path)
    assert "\n" not in str(err.value) and "malformed" in str(err.value) and repr(path) in str(err.value)


def test_the_mapping_refuses_a_malformed_path_when_built() -> None:
    with pytest.raises(ValidationError, match=r"backslash must be followed"):
        ResponseMapping(score=r"@search\score")


def test_yaml_single_and_double_quoted_escapes_read_the_azure_score(tmp_path: Path) -> None:
    for quoted in ("'@search\\.score'", '"@search\\\\.score"'):
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(f"request: {{url: 'http://x/indexes/i/docs/search'}}\n"
                       f"response: {{results_path: value, doc_id: id, score: {quoted}}}\n")
        spec = load_model(cfg, EvalSpec)
        assert split_path(spec.response.score or "") == ("@search.score",)
        parsed = parse_response(AZURE, spec.response, "q1")
        assert parsed.hits == (Hit("d7", 0.033, "Seven"), Hit("d2", 0.016, "Two"))


def test_a_malformed_path_in_a_config_file_names_file_line_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("request: {url: 'http://x/search'}\nresponse:\n  score: '@search\\score'\n")
    with pytest.raises(ConfigError) as err:
        load_model(cfg, EvalSpec)
    text = str(err.value)
    assert "\n" not in text and "eval.yaml:3" in text and "response.score" in text and "malformed" in text


def test_without_the_escape_the_dot_still_walks_into_an_object() -> None:
    assert resolve_path({"@search": {"score": 1.0}}, "@search.score") == 1.0
    assert resolve_path({"@search.score": 1.0}, r"@search\.score") == 1.0
    assert resolve_path({"@search": {"score": 1.0}}, r"@search\.score") is mapping_mod._MISSING
    assert resolve_path({"a": [{"b": 2}]}, "a.0.b") == 2


def test_both_decoders_read_the_escaped_key_and_the_typed_one_keeps_its_fast_path() -> None:
    import json

    mapping = ResponseMapping(results_path="value", doc_id="id", score=r"@search\.score", title="title")
    decoder = AnswerDecoder(mapping, 50)
    assert decoder.typed
    body = json.dumps(AZURE).encode()
    assert decoder.parse(body, "q1") == parse_response(AZURE, mapping, "q1", top_k=50)
    assert [h.score for h in decoder.parse(body, "q1").hits] == [0.033, 0.016]
