import math

import pytest
from pydantic import ValidationError

from tuner.errors import InputError
from tuner.evaluation import EvalSpec, RequestMapping, check_gates, parse_gate, scorecard_keys


def _spec(**kw):
    return EvalSpec(request=RequestMapping(url="http://x"), **kw)


@pytest.mark.parametrize(
    ("budget", "n", "allowed"),
    [(0.05, 40, math.floor(0.05 * 40)), (0.05, 10, 0), (0.1, 30, 3), (0, 100, 0), (3, 10, 3), (1, 2, 1)],
)
def test_failure_budget_fraction_or_count(budget, n, allowed):
    assert _spec(max_failed_queries=budget).allowed_failures(n) == allowed


def test_spec_rejects_unknown_keys_and_fractional_counts():
    with pytest.raises(ValidationError, match="extra"):
        EvalSpec.model_validate({"request": {"url": "http://x", "bodyy": {}}})
    with pytest.raises(ValidationError, match="whole count"):
        _spec(max_failed_queries=1.5)


def test_gates_parse_and_check():
    under = parse_gate("Primary_Metric_Score=0.6", "under")
    over = parse_gate(" OOS_FP_Rate = 0.1", "over")
    metrics = {"Primary_Metric_Score": 0.59, "OOS_FP_Rate": 0.1}
    misses = check_gates(metrics, [under, over])
    assert [m.gate for m in misses] == [under]
    assert misses[0].message() == (
        "gate missed: Primary_Metric_Score = 0.5900 is below 0.6 (required Primary_Metric_Score >= 0.6)"
    )
    assert check_gates({"Primary_Metric_Score": 0.6, "OOS_FP_Rate": 0.11}, [under, over])[0].gate == over
    assert check_gates({"Primary_Metric_Score": float("nan"), "OOS_FP_Rate": 0}, [under])[0].value != 0


@pytest.mark.parametrize("text", ["Primary_Metric_Score", "=0.5", "NDCG@10=high"])
def test_bad_gate_text(text):
    with pytest.raises(InputError, match="--fail-under"):
        parse_gate(text, "under")


def test_unknown_gate_metric_lists_known():
    with pytest.raises(InputError, match=r"unknown metric 'Primary'; known metrics: "):
        check_gates({"Primary_Metric_Score": 1.0}, [parse_gate("Primary=0.5", "under")])


def test_scorecard_keys_cover_the_headline_names():
    keys = scorecard_keys()
    for name in ("Primary_Metric_Score", "NDCG@20", "MAP@10", "OOS_FP_Rate", "InScope_Handoff_Rate", "Handoff_F1",
                 "Latency_Avg_ms", "Latency_P50_ms", "Latency_P95_ms", "Judged@10", "Judged@20", "Failed_Queries", "N_Queries"):
        assert name in keys
