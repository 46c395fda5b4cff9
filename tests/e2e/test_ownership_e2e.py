"""End to end: a config owned by the service's user keeps its owner and mode.

The reference backend runs as a process target on the demo data; its config is
``nobody:nogroup`` 0640, as a service account's config would be. A real ``tuner run``
patches it every trial and restores it at the end; ``tuner apply`` writes the best
trial into it. Neither may leave it ``root:root`` (the service could no longer read
it at its next restart). Giving a file another user's owner needs root: the test
skips without it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from e2e.test_study_e2e import demo_data, make_project  # noqa: F401 - demo_data is a fixture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="giving the config another user's owner (chown) needs root"),
]


def _service_ids() -> tuple[int, int]:
    try:
        return pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip("no nobody user / nogroup group on this machine")


def _meta(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def _tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})


def test_run_and_apply_keep_the_configs_owner_and_mode(demo_data: Path, tmp_path: Path) -> None:  # noqa: F811
    uid, gid = _service_ids()
    # No baseline: both trials are shortlist variants, so the best one differs from the
    # file and apply really writes it.
    exp_path = make_project(tmp_path, demo_data, study="owner", n_trials=2, baseline=False,
                            tracking={"enabled": False})
    config = tmp_path / "backend" / "config.yaml"
    os.chown(config, uid, gid)
    config.chmod(0o640)
    original = config.read_bytes()

    run = _tuner("run", str(exp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert config.read_bytes() == original
    assert _meta(config) == (uid, gid, 0o640)
    study = optuna.load_study(study_name="owner", storage=f"sqlite:///{tmp_path / '.tuner' / 'optuna.db'}")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2  # the rest of the shortlist waits

    # Both trials solved their gates client-side (re-measured within ~0.01, see
    # test_study_e2e): the tolerance only keeps a rollback from hiding the write.
    applied = _tuner("apply", str(exp_path), "--tolerance", "0.05")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "applied trial #" in applied.stdout
    assert config.read_bytes() != original
    assert _meta(config) == (uid, gid, 0o640)
    backups = list((tmp_path / ".tuner" / "backups").glob("*/0-config.yaml"))
    assert len(backups) == 1 and backups[0].read_bytes() == original
    assert stat.S_IMODE(backups[0].stat().st_mode) & ~0o640 == 0  # never more open than the config
