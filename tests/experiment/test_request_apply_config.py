"""``target.request.apply_to`` (the application's file `tuner apply` writes with channel:
request): checked when the experiment loads, each problem one line naming where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.reference_experiment import write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.errors import ConfigError

BIND = {"fusion.rrf_k": "body.overrides.fusion.rrf_k", "fusion.weights.dense": "body.overrides.fusion.weights.dense"}
PATHS = {"fusion.rrf_k": "search.hybrid.rrf_k", "fusion.weights.dense": "search.hybrid.vector_weight"}


def load(tmp_path: Path, apply_to: dict[str, Any]) -> Any:
    path = write_reference_experiment(tmp_path, study="s", n_trials=1, target={
        "channel": "request", "config_files": [], "request": {"bind": BIND, "apply_to": apply_to}})
    return load_experiment(path, check_paths=False)


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and "experiment.yaml:" in message
    return message


def test_the_file_is_resolved_against_the_experiment_and_each_bound_key_has_its_path(tmp_path: Path) -> None:
    exp = load(tmp_path, {"file": "app/search.toml", "paths": PATHS})
    assert exp.target.apply_to is not None
    assert exp.target.apply_to.file == (tmp_path / "app" / "search.toml").resolve()
    assert exp.target.apply_to.paths == PATHS


def test_a_path_for_a_key_that_is_not_bound_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, {"file": "app.yaml", "paths": {**PATHS, "fusion.rrf_kk": "search.k"}})
    assert "target.request: apply_to.paths: fusion.rrf_kk is not bound in request.bind" in one_line(exc)


def test_a_bound_key_without_a_place_in_the_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, {"file": "app.yaml", "paths": {"fusion.rrf_k": "search.hybrid.rrf_k"}})
    assert "apply_to.paths has no place for fusion.weights.dense (bound in request.bind)" in one_line(exc)


def test_an_unsupported_suffix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, {"file": "app/search.ini", "paths": PATHS})
    message = one_line(exc)
    assert "target.request.apply_to.file: search.ini: suffix '.ini'" in message
    assert "point apply_to.file at one" in message


def test_apply_to_is_read_with_channel_request_only(tmp_path: Path) -> None:
    path = write_reference_experiment(tmp_path, study="s", n_trials=1, target={
        "request": {"bind": BIND, "apply_to": {"file": "app.yaml", "paths": PATHS}}})
    with pytest.raises(ConfigError, match="request.bind is read with channel: request only"):
        load_experiment(path, check_paths=False)
