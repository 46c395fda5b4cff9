"""Batch evaluation of a live search API against cached labels.

- ``spec``: the request / response mapping (typed config, unknown keys rejected)
- ``mapping``: pure translation query record -> request body, JSON response -> hits
- ``client``: the HTTP seam (httpx, bounded concurrency, retries, request ids)
- ``oos``: out-of-scope / handoff metrics, confidence threshold sweep, fallback histogram
- ``result``: ``evaluate_responses`` (pure) -> ``BatchResult``; ``ResultBuilder`` the same
  one outcome at a time (what ``run_batch`` feeds as answers arrive)
- ``batch``: ``run_batch`` (sends the queries, failure budget, per-query callback)
- ``gates``: CI regression gates over a scorecard

The names below are imported from their module on first use: an experiment file's
sections (``spec``, ``holdout``) are read without the HTTP client and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.evaluation.batch import OnResult, run_batch, run_batch_async
    from tuner.evaluation.gates import Gate, GateMiss, check_gates, parse_gate
    from tuner.evaluation.mapping import Hit, ParsedResponse
    from tuner.evaluation.outcomes import FailedQuery, QueryResponse, UnjudgedHit
    from tuner.evaluation.result import BatchResult, ResultBuilder, evaluate_responses, query_record, scorecard_keys
    from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

_MODULE_OF = {
    "OnResult": "batch",
    "run_batch": "batch",
    "run_batch_async": "batch",
    "Gate": "gates",
    "GateMiss": "gates",
    "check_gates": "gates",
    "parse_gate": "gates",
    "Hit": "mapping",
    "ParsedResponse": "mapping",
    "FailedQuery": "outcomes",
    "QueryResponse": "outcomes",
    "UnjudgedHit": "outcomes",
    "BatchResult": "result",
    "ResultBuilder": "result",
    "evaluate_responses": "result",
    "query_record": "result",
    "scorecard_keys": "result",
    "EvalSpec": "spec",
    "RequestMapping": "spec",
    "ResponseMapping": "spec",
}

__all__ = [  # a literal, so linters and type checkers see the re-exports; equal to sorted(_MODULE_OF)
    "BatchResult",
    "EvalSpec",
    "FailedQuery",
    "Gate",
    "GateMiss",
    "Hit",
    "OnResult",
    "ParsedResponse",
    "QueryResponse",
    "RequestMapping",
    "ResponseMapping",
    "ResultBuilder",
    "UnjudgedHit",
    "check_gates",
    "evaluate_responses",
    "parse_gate",
    "query_record",
    "run_batch",
    "run_batch_async",
    "scorecard_keys",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
