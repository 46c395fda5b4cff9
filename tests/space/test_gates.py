"""Gates in a search space: ``gate: confidence | min_score`` declares a post-retrieval
param's role whatever its key; ``post_retrieval: true`` alone works on the reference
backend's two keys only, and every other misuse is refused at load with one line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest

from tuner.config.space.loading import load_space
from tuner.errors import ConfigError

optuna.logging.set_verbosity(optuna.logging.WARNING)


def write(tmp_path: Path, params: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text("params:\n" + textwrap.indent(textwrap.dedent(params), "  "))
    return path


def test_a_gate_on_any_key_is_post_retrieval_with_its_role(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, """\
        retrieval.k: {type: int, low: 1, high: 10}
        rag.min_confidence: {type: float, low: 0.0, high: 0.9, step: 0.05, gate: confidence}
        rag.cutoff: {type: float, low: 0.0, high: 0.5, gate: min_score}
        """))
    assert space.post_retrieval == frozenset({"rag.min_confidence", "rag.cutoff"})
    assert space["rag.min_confidence"].gate == "confidence"
    assert space["rag.cutoff"].gate == "min_score"
    assert space["retrieval.k"].gate is None
    trial = optuna.create_study().ask()
    assert set(space.suggest(trial, skip_post_retrieval=True)) == {"retrieval.k"}


def test_post_retrieval_alone_infers_the_reference_keys_roles(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, """\
        confidence.threshold: {type: float, low: 0.2, high: 0.8, post_retrieval: true}
        citation.min_score: {type: float, low: 0.0, high: 0.5, post_retrieval: true}
        """))
    assert space["confidence.threshold"].gate == "confidence"
    assert space["citation.min_score"].gate == "min_score"


def test_an_explicit_role_wins_over_the_key_name(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, "citation.min_score: {type: float, low: 0, high: 1, gate: confidence}\n"))
    assert space["citation.min_score"].gate == "confidence"


def test_a_param_named_otherwise_takes_the_role_of_its_path(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, (
        "conf: {type: float, low: 0, high: 1, path: confidence.threshold, post_retrieval: true}\n")))
    assert space["conf"].gate == "confidence"


@pytest.mark.parametrize(
    ("params", "needles"),
    [
        ("rag.min_confidence: {type: float, low: 0, high: 1, post_retrieval: true}",
         ["rag.min_confidence: post_retrieval: true does not say which gate it is",
          "add gate: confidence", "or gate: min_score"]),
        ("a: {type: float, low: 0, high: 1, gate: confidence}\n"
         "b: {type: float, low: 0, high: 1, gate: confidence}",
         ["space.yaml:3: b: a second gate: confidence (after a)"]),
        ("confidence.threshold: {type: float, low: 0, high: 1, post_retrieval: true}\n"
         "rag.min_confidence: {type: float, low: 0, high: 1, gate: confidence}",
         ["rag.min_confidence: a second gate: confidence (after confidence.threshold)"]),
        ("confidence.top_m: {type: int, low: 1, high: 10, post_retrieval: true}",
         ["confidence.top_m: post_retrieval/gate needs a float", "this is int", "sampler searches it"]),
        ("a: {type: categorical, choices: [x, y], gate: min_score}", ["a: post_retrieval/gate needs a float"]),
        ("a: {type: float, low: 0, high: 1, gate: threshold}", ["gate", "'confidence' or 'min_score'"]),
        ("a: {type: float, low: 0, high: 1, gate: confidence, post_retrieval: false}",
         ["gate: implies post_retrieval: true; drop post_retrieval: false"]),
    ],
)
def test_gate_misuse_is_one_line_naming_file_param_and_fix(tmp_path: Path, params: str, needles: list[str]) -> None:
    path = write(tmp_path, params + "\n")
    with pytest.raises(ConfigError) as exc:
        load_space(path)
    message = str(exc.value)
    assert "\n" not in message and "space.yaml:" in message
    for needle in needles:
        assert needle in message
