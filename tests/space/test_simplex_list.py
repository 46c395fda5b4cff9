"""A simplex over a list of weights (an engine's JSON: OpenSearch's
``combination.parameters.weights: [0.3, 0.7]``): components named by position, read from
the list, written back as a list, kept as found for the baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config.formats import json_format
from tuner.config.space.loading import load_space
from tuner.errors import ConfigError

DOC = {"combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.3, 0.7]}}}
PATH = "combination.parameters.weights"


def space(tmp_path: Path, components: str = '["0", "1"]') -> object:
    path = tmp_path / "space.yaml"
    path.write_text(f"params:\n  fusion.weights:\n    type: simplex\n    components: {components}\n    path: {PATH}\n")
    return load_space(path)


def test_the_list_is_read_by_position_and_the_baseline_writes_it_back_as_found(tmp_path: Path) -> None:
    s = space(tmp_path)
    assert s.validate_against([DOC]) == []
    found = s.current_assignment([DOC])
    assert found == {"fusion.weights": {"0": 0.3, "1": 0.7}}
    assert s.edits(s.as_found(found, [DOC])) == {0: {PATH: [0.3, 0.7]}}


def test_a_trials_weights_are_written_as_a_list_the_json_patch_takes(tmp_path: Path) -> None:
    s = space(tmp_path)
    edits = s.edits({"fusion.weights": {"0": 0.25, "1": 0.75}})
    assert edits == {0: {PATH: [0.25, 0.75]}}
    text = json_format.patch('{"combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.3, 0.7]}}}',
                             edits[0])
    assert text == '{"combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.25, 0.75]}}}'


@pytest.mark.parametrize(("components", "doc", "needle"), [
    ('["text", "dense"]', DOC, r'a simplex over a list of weights names its components by position, components: \["0", "1"\]'),
    ('["0", "1", "2"]', DOC, r"config has a list of 2"),
    ('["0", "1"]', {"combination": {"parameters": {"weights": [0.3, "x"]}}}, r"config weights are not all numbers"),
])
def test_a_list_the_simplex_cannot_take_is_one_line(tmp_path: Path, components: str, doc: dict, needle: str) -> None:
    s = space(tmp_path, components)
    with pytest.raises(ConfigError, match=needle.replace('"', "'")):
        s.validate_against([doc])
