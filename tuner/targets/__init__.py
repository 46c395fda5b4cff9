"""Backends the tuner can restart: process, docker, none."""

from tuner.targets.base import Target

__all__ = ["Target"]
