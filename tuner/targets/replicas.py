"""One worker's own backend replica: a copy of the config files, a state dir, a port
and, for docker targets, its own compose project (tuner.targets.compose_replica).

    replica_of(experiment, index) -> (Experiment bound to the replica, Replica)
    Replica.up(note) / .down()                 # a docker replica's compose project

The originals are never patched by workers: each replica patches its own copy
(``config.replica-N.yaml`` next to the original, so relative paths still resolve).
The clean-up after a killed worker is tuner.targets.reaper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.targets.compose_replica import make_compose_replica
from tuner.targets.replica import Replica


def replica_of(experiment: Any, index: int) -> tuple[Any, Replica]:
    """The experiment as replica ``index`` runs it: the config files copied next to the
    originals (``config.replica-N.yaml``, so relative paths inside them still resolve),
    its own state dir (restore journal, result cache, trial reports), its port
    (``workers.ports``, else a free one) and, for a docker target, its own compose
    project (``workers.replica_name``), which the returned experiment's
    ``target.docker.project`` names.

    The copies are made from the originals at every start: the originals are never
    patched by workers, so a crashed replica cannot leak a trial's values into them.
    """
    from tuner.config.experiment import free_port

    target = experiment.target
    _check_port_placeholders(experiment)
    copies = []
    for original in target.config_files:
        copy_path = original.with_name(f"{original.stem}.replica-{index}{original.suffix}")
        _atomic_copy(original, copy_path)
        copies.append(copy_path)
    state_dir = experiment.state_dir / "replicas" / str(index)
    state_dir.mkdir(parents=True, exist_ok=True)
    port = experiment.workers.port_for(index)
    if port is None and target.apply in ("process", "docker"):
        port = free_port()
    update: dict[str, Any] = {"config_files": copies}
    replica: Replica
    if target.apply == "docker":
        replica = make_compose_replica(experiment, index, copies, state_dir, port)
        update["docker"] = target.docker.model_copy(update={"project": replica.project})
    else:
        replica = Replica(index, copies, state_dir)
    bound = experiment.model_copy(update={"target": target.model_copy(update=update), "state_dir": state_dir})
    return bound.bind_port(port), replica


def _check_port_placeholders(experiment: Any) -> None:
    target = experiment.target
    if target.apply == "process" and "{port}" not in " ".join(target.process.command):
        raise ConfigError(
            "target.process.command has no {port}: replicas would all bind the same port; "
            "pass the port to the backend, e.g. --port {port}"
        )
    if target.apply not in ("process", "docker"):
        return
    urls = [("target.health.url", target.health.url), ("evaluation.request.url", experiment.evaluation.request.url)]
    if target.reload is not None and target.reload.http is not None:
        urls.append(("target.reload.http.url", target.reload.http.url))
    for where, url in urls:
        if "{port}" not in url:
            raise ConfigError(
                f"{where} {url!r} has no {{port}}: every replica would be measured on the same"
                " backend; write the port as {port}, e.g. http://127.0.0.1:{port}/health"
            )


def _atomic_copy(src: Path, dst: Path) -> None:
    from tuner.files import copy_preserving

    copy_preserving(src, dst)  # the original's mode and owner: the replica's backend reads it as the service would
