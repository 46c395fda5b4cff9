"""Batch evaluation of a live search API against cached labels.

- ``spec``: the request / response mapping (typed config, unknown keys rejected)
- ``mapping``: pure translation query record -> request body, JSON response -> hits
- ``client``: the HTTP seam (httpx, bounded concurrency, retries, request ids)
- ``oos``: out-of-scope / handoff metrics, confidence threshold sweep, fallback histogram
- ``result``: ``evaluate_responses`` (pure) -> ``BatchResult``; ``ResultBuilder`` the same
  one outcome at a time (what ``run_batch`` feeds as answers arrive)
- ``batch``: ``run_batch`` (sends the queries, failure budget, per-query callback)
- ``gates``: CI regression gates over a scorecard
"""

from tuner.evaluation.batch import OnResult, run_batch, run_batch_async
from tuner.evaluation.gates import Gate, GateMiss, check_gates, parse_gate
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import FailedQuery, QueryResponse, UnjudgedHit
from tuner.evaluation.result import BatchResult, ResultBuilder, evaluate_responses, query_record, scorecard_keys
from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

__all__ = [
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
