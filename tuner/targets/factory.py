"""Build the Target an experiment's ``target.apply`` names.

    make_target(target: TargetConfig, state_dir: Path) -> Target

``process`` and ``none`` are built in. ``docker`` (``DockerTarget`` of
``tuner.targets.docker``) is imported lazily, so only a docker target needs the docker
SDK; a missing package (or a copy of the tuner without the module) is a ConfigError
that says so. Call ``Experiment.bind_port`` first when the command or URLs use ``{port}``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from tuner.config.target import TargetConfig
from tuner.errors import ConfigError
from tuner.targets.base import Target
from tuner.targets.none import NoneTarget
from tuner.targets.process import ProcessTarget


def make_target(target: TargetConfig, state_dir: Path) -> Target:
    if target.apply == "none":
        return NoneTarget(settle_s=target.none.settle_s)
    if target.apply == "process":
        if target.process is None:  # guarded by TargetConfig's validator as well
            raise ConfigError("target.apply is process but target.process is missing (add a command)")
        port = target.port if isinstance(target.port, int) else None
        return ProcessTarget(target.process, config_files=target.config_files, port=port, state_dir=state_dir)
    if target.apply == "docker":
        if target.docker is None:
            raise ConfigError("target.apply is docker but target.docker is missing (add the compose service)")
        try:
            docker = importlib.import_module("tuner.targets.docker")
        except ModuleNotFoundError as exc:
            if exc.name != "tuner.targets.docker":
                raise ConfigError(f"docker target needs the package {exc.name} (pip install {exc.name})") from exc
            raise ConfigError(
                "target.apply: docker: docker support is not installed in this copy of the tuner "
                "(use apply: process, or none)"
            ) from exc
        target_cls = docker.DockerTarget
        return target_cls(
            target.docker,
            config_files=list(target.config_files),
            state_dir=state_dir,
            reloads=target.reload is not None,
        )
    raise ConfigError(f"target.apply: unknown value {target.apply!r} (process, docker or none)")
