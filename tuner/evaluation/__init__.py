"""Batch evaluation of a live search API against cached labels."""

from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

__all__ = ["EvalSpec", "RequestMapping", "ResponseMapping"]
