"""End to end: `tuner run` tunes the reference backend through a JSON, then a TOML config
file. Every trial's values reach the backend (read back from GET /admin/config while the
trial is measured) and the file is byte-identical at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import tomlkit
from e2e.test_study_e2e import AdminConfigProbe, demo_data  # noqa: F401  (module fixture reused)
from optuna.trial import TrialState
from ruamel.yaml import YAML
from support.reference_experiment import FUSION_SPACE, copy_backend_config, write_reference_experiment

from tuner.config.configpatch import get_path
from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def as_format(yaml_config: Path, suffix: str) -> Path:
    """The reference config (YAML, from copy_backend_config) rewritten as JSON (4-space
    indent) or TOML, with a comment in the TOML one."""
    plain = json.loads(json.dumps(YAML(typ="safe", pure=True).load(yaml_config.read_text())))
    path = yaml_config.with_suffix(suffix)
    if suffix == ".json":
        path.write_text(json.dumps(plain, indent=4) + "\n", encoding="utf-8")
    else:
        doc = tomlkit.document()
        doc.add(tomlkit.comment("The reference backend's config, as TOML: comments survive a study."))
        for key, value in plain.items():
            doc[key] = value
        path.write_text(tomlkit.dumps(doc), encoding="utf-8")
    yaml_config.unlink()
    return path


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_study_tunes_a_json_or_toml_config_and_restores_it_byte_for_byte(
    demo_data: Path,  # noqa: F811
    tmp_path: Path,
    suffix: str,
) -> None:
    (tmp_path / "data").mkdir()
    for name in ("queries.jsonl", "qrels.txt", "corpus.jsonl"):
        (tmp_path / "data" / name).write_bytes((demo_data / name).read_bytes())
    config = as_format(copy_backend_config(tmp_path), suffix)
    original = config.read_bytes()
    exp_path = write_reference_experiment(
        tmp_path,
        study=f"formats{suffix[1:]}",
        n_trials=3,
        project_root=".",
        state_dir=".tuner",
        sampler={"type": "random", "seed": 5},
        timeout_s=600,
        target={"config_files": [f"backend/config{suffix}"], "health": {"deadline_s": 60}},
        search_space=FUSION_SPACE,
    )
    exp = load_experiment(exp_path).bind_port()
    probe = AdminConfigProbe(exp.target.health.url.removesuffix("/health"))
    run_experiment(exp, observer=probe)

    trials = optuna.load_study(study_name=f"formats{suffix[1:]}", storage=exp.storage).get_trials()
    assert len(trials) == 3 and {t.state for t in trials} == {TrialState.COMPLETE}
    assert sorted(probe.seen) == [0, 1, 2]
    for t in trials:
        for path, wanted in assignment_of(t).items():
            served = get_path(probe.seen[t.number], path)
            if isinstance(wanted, dict):
                assert all(math.isclose(served[k], v, rel_tol=1e-9) for k, v in wanted.items()), (t.number, path)
            else:
                assert served == wanted, (t.number, path, wanted)
    # trials after the baseline really changed the served values (the sampler drew new ones)
    assert any(probe.seen[n]["fusion"] != probe.seen[0]["fusion"] for n in (1, 2))
    assert config.read_bytes() == original
    assert not exp.journal_path.exists()
