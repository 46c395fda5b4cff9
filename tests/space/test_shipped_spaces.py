"""The shipped search spaces validate against the reference backend's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config.configpatch import ConfigPatcher
from tuner.config.space.loading import load_space

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["reference_fusion.yaml", "reference_full.yaml"])
def test_shipped_space_validates_against_backend_config(name: str) -> None:
    config = REPO / "backend" / "config.yaml"
    space = load_space(REPO / "search_space" / name, [config])
    patcher = ConfigPatcher([config])
    assert space.validate_against(patcher.documents(), patcher.names) == []
    baseline = space.current_assignment(patcher.documents())
    # The baseline re-encodes to Optuna params without loss.
    assert set(space.params_for(baseline)) <= set(space.distributions())
    assert baseline["fusion.method"] == patcher.documents()[0]["fusion"]["method"]
