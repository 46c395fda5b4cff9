"""The backend a one-off command starts on the config as found and stops after:
`tuner eval --experiment` measures it the way `tuner check` checks it (tuner.ops.check),
so nobody has to start it by hand and pass its port.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def can_start(experiment: Any) -> bool:
    """Whether the experiment names a backend the tuner starts (``target.apply`` process
    or docker); ``none``: the backend runs by itself, the tuner only patches files."""
    return experiment.target.apply != "none"


@contextmanager
def served_as_found(experiment: Any, *, command: str) -> Iterator[dict[str, Any]]:
    """Start the experiment's backend on the config files as they are, wait until it is
    healthy, yield its health answer; stop it on the way out, whatever happened.

    ``experiment`` has its port bound (``Experiment.bind_port``). The config locks are
    held meanwhile (tuner.study.storage.locks): a run with a trial's values in the files stops
    this with LockHeld naming it, and no run patches them while this backend reads them.
    """
    from tuner.study.storage.file_locks import config_locks
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    with config_locks(experiment.target.config_files, command=command):
        target = make_target(experiment.target, experiment.state_dir)
        try:
            target.start()
            yield wait_target_healthy(experiment.target.health, target)
        finally:
            target.close()
