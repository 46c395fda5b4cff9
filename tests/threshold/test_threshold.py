"""The threshold solver equals a brute-force loop that re-evaluates every threshold
through the evaluation core (tuner.evaluation.result.evaluate_responses)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.data.dataset import Query, QuerySet
from tuner.errors import ConfigError
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.result import evaluate_responses
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, Retrieval, solve

# Another backend's names for the same two gates: solved by role, not by key.
RENAMED = ("rag.min_confidence", "rag.cutoff")


class MaxFP:
    """A constraint 'OOS_FP_Rate <= bound' in the shape experiment.Constraint has."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def violation(self, metrics):
        return metrics["OOS_FP_Rate"] - self.bound


def synthetic_batch(seed: int, n_in: int = 24, n_oos: int = 10, n_docs: int = 40, depth: int = 15):
    rng = np.random.default_rng(seed)
    queries, responses, failed, qrels = [], [], [], {}
    for i in range(n_in + n_oos):
        oos = i >= n_in
        qid = f"q{i}"
        queries.append(Query(qid, f"text {i}", "short", "s", "oos" if oos else "in"))
        docs = rng.choice(n_docs, size=depth, replace=False)
        scores = np.sort(rng.uniform(0, 1, depth))[::-1]
        hits = tuple(Hit(f"d{d}", float(s), f"title {d}") for d, s in zip(docs, scores))
        # In-scope queries tend to be more confident; the ranges overlap on purpose.
        conf = float(rng.uniform(0.3, 0.9) if not oos else rng.uniform(0.1, 0.7))
        if not oos:
            qrels[qid] = {f"d{d}": int(rng.integers(0, 4)) for d in rng.choice(n_docs, size=12, replace=False)}
        if i == 3:
            failed.append(FailedQuery(qid, f"r{i}", "timeout"))
            continue
        responses.append(QueryResponse(qid, f"r{i}", ParsedResponse(hits, conf, conf < 0.6, "0")))
    return QuerySet("synthetic", "h", tuple(queries)), qrels, responses, failed


def brute_force(qs, qrels, responses, failed, t, m):
    """What the backend would have returned with threshold t and min_score m, evaluated
    the slow way: rebuild every response and run the evaluation core on it."""
    gated = []
    for r in responses:
        kept = tuple(h for h in r.response.hits if h.score >= m)
        conf = r.response.confidence
        handoff = conf < t or not kept
        gated.append(QueryResponse(r.query_id, r.request_id, ParsedResponse(kept, conf, handoff, "0")))
    return evaluate_responses(qs, qrels, gated, failed).metrics


@pytest.mark.parametrize("keys", [(CONFIDENCE_PARAM, MIN_SCORE_PARAM), RENAMED])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_and_choice_equal_brute_force(seed, keys):
    conf_key, cut_key = keys
    qs, qrels, responses, failed = synthetic_batch(seed)
    batch = evaluate_responses(qs, qrels, responses, failed)
    gates = [GateRange(conf_key, 0.2, 0.8, 0.05, role="confidence"),
             GateRange(cut_key, 0.0, 0.6, 0.1, role="min_score")]
    bound = 0.3
    solution = solve(Retrieval.from_batch(batch), gates, constraints=[MaxFP(bound)])

    ts = [round(0.2 + 0.05 * i, 2) for i in range(13)]
    ms = [round(0.1 * i, 1) for i in range(7)]
    assert len(solution.table) == len(ts) * len(ms)
    brute = {}
    for t in ts:
        for m in ms:
            brute[(t, m)] = brute_force(qs, qrels, responses, failed, t, m)
    for row in solution.table.to_dict("records"):
        expected = brute[(round(row[conf_key], 2), round(row[cut_key], 1))]
        assert row["Primary_Metric_Score"] == pytest.approx(expected["Primary_Metric_Score"], abs=1e-12)
        assert row["OOS_FP_Rate"] == pytest.approx(expected["OOS_FP_Rate"], abs=1e-12)
        assert row["InScope_Handoff_Rate"] == pytest.approx(expected["InScope_Handoff_Rate"], abs=1e-12)

    feasible = {k: v for k, v in brute.items() if v["OOS_FP_Rate"] <= bound}
    assert feasible, "the synthetic batch should admit a feasible threshold"
    best = max(v["Primary_Metric_Score"] for v in feasible.values())
    assert solution.feasible
    assert solution.objective == pytest.approx(best, abs=1e-12)
    chosen = (round(solution.values[conf_key], 2), round(solution.values[cut_key], 1))
    assert solution.by_role == {"confidence": solution.values[conf_key], "min_score": solution.values[cut_key]}
    assert chosen in feasible
    assert feasible[chosen]["Primary_Metric_Score"] == pytest.approx(best, abs=1e-12)
    # Every scorecard metric of the solution is the gated batch's at the chosen pair.
    from tuner.metrics import DEFAULT_METRICS

    for name in DEFAULT_METRICS:
        assert solution.metrics[name] == pytest.approx(feasible[chosen][name], abs=1e-12), name


def test_without_constraints_the_best_threshold_is_the_lowest_that_keeps_all_answers():
    qs, qrels, responses, failed = synthetic_batch(4, n_oos=0)
    batch = evaluate_responses(qs, qrels, responses, failed)
    solution = solve(Retrieval.from_batch(batch), [GateRange(CONFIDENCE_PARAM, 0.0, 1.0, 0.01)])
    # Handing off an in-scope query can only lose score, so every t <= min confidence ties.
    min_conf = min(r.response.confidence for r in responses)
    plateau = [t for t in np.round(np.arange(0, 1.0001, 0.01), 2) if t <= min_conf]
    assert len(plateau) > 10
    # nothing to satisfy and no value as found: the tie that hands off least (no longer its middle)
    assert solution.values[CONFIDENCE_PARAM] == plateau[0] == 0.0
    assert solution.moved == ""
    full = brute_force(qs, qrels, responses, failed, 0.0, -math.inf)
    assert solution.objective == pytest.approx(full["Primary_Metric_Score"])


def test_infeasible_everywhere_returns_least_violating_point():
    qs, qrels, responses, failed = synthetic_batch(5)
    batch = evaluate_responses(qs, qrels, responses, failed)
    solution = solve(Retrieval.from_batch(batch), [GateRange(CONFIDENCE_PARAM, 0.0, 0.2, 0.1)],
                     constraints=[MaxFP(-1.0)])
    assert not solution.feasible
    assert solution.violation == pytest.approx(solution.table["violation"].min())


def test_bad_gates_are_rejected():
    qs, qrels, responses, failed = synthetic_batch(6)
    retrieval = Retrieval.from_batch(evaluate_responses(qs, qrels, responses, failed), retrieved_min_score=0.2)
    with pytest.raises(ConfigError, match="retrieve with min_score"):
        solve(retrieval, [GateRange(MIN_SCORE_PARAM, 0.0, 0.5, 0.1)])
    with pytest.raises(ConfigError, match="cannot be solved client-side"):
        solve(retrieval, [GateRange("fusion.rrf_k", 1, 100, 1)])
    with pytest.raises(ConfigError, match="give it one of the roles"):
        GateRange("rag.min_confidence", 0.0, 0.5, role="threshold")
    with pytest.raises(ConfigError, match="a second confidence gate"):
        solve(retrieval, [GateRange(CONFIDENCE_PARAM, 0.0, 0.5), GateRange(RENAMED[0], 0.0, 0.5, role="confidence")])
    with pytest.raises(ConfigError, match="repeat a key"):
        solve(retrieval, [GateRange("rag.x", 0.2, 0.5, role="confidence"),
                          GateRange("rag.x", 0.2, 0.5, role="min_score")])
    with pytest.raises(ConfigError, match=r"rag\.cutoff: the retrieval ran with min_score=0\.2"):
        solve(retrieval, [GateRange(RENAMED[1], 0.0, 0.5, 0.1, role="min_score")])
    with pytest.raises(ConfigError, match="empty"):
        solve(retrieval, [GateRange(CONFIDENCE_PARAM, 0.9, 0.1)])


def test_grid_includes_both_ends():
    assert list(GateRange(CONFIDENCE_PARAM, 0.2, 0.5, 0.15).values(0.01)) == [0.2, 0.35, 0.5]
    assert list(GateRange(CONFIDENCE_PARAM, 0.2, 0.45, 0.1).values(0.01)) == [0.2, 0.3, 0.4, 0.45]


def test_gates_come_from_the_search_space_and_solve_batch_matches_solve(tmp_path):
    from tuner.config.space.loading import load_space
    from tuner.study.gates.threshold import retrieval_values, solvable_gates, solve_batch

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "params:\n"
        "  fusion.rrf_k: {type: int, low: 1, high: 100}\n"
        "  confidence.threshold: {type: float, low: 0.2, high: 0.8, step: 0.05, post_retrieval: true}\n"
        "  citation.min_score: {type: float, low: 0.0, high: 0.6, step: 0.1, post_retrieval: true}\n"
    )
    gates = solvable_gates(load_space(space_file))
    assert {g.param: (g.low, g.high, g.step) for g in gates} == {
        CONFIDENCE_PARAM: (0.2, 0.8, 0.05), MIN_SCORE_PARAM: (0.0, 0.6, 0.1)}
    assert retrieval_values(gates) == {CONFIDENCE_PARAM: 0.2, MIN_SCORE_PARAM: 0.0}
    qs, qrels, responses, failed = synthetic_batch(7)
    batch = evaluate_responses(qs, qrels, responses, failed)
    direct = solve(Retrieval.from_batch(batch), gates, constraints=[MaxFP(0.3)])
    assert solve_batch(batch, gates, constraints=[MaxFP(0.3)]).values == direct.values

    space_file.write_text("params:\n  confidence.top_m: {type: int, low: 1, high: 10, post_retrieval: true}\n")
    with pytest.raises(ConfigError, match="sampler searches it"):
        solvable_gates(load_space(space_file))


@pytest.mark.parametrize("seed", [0, 1])
def test_an_unsolved_confidence_gate_keeps_the_backends_handoffs(seed):
    # synthetic_batch's backend hands off below confidence 0.6 (a sampled threshold)
    qs, qrels, responses, failed = synthetic_batch(seed)
    batch = evaluate_responses(qs, qrels, responses, failed)
    solution = solve(Retrieval.from_batch(batch), [GateRange(MIN_SCORE_PARAM, 0.0, 0.6, 0.1)])
    assert len(solution.table) == 7
    for row in solution.table.to_dict("records"):
        expected = brute_force(qs, qrels, responses, failed, 0.6, row[MIN_SCORE_PARAM])
        for name in ("Primary_Metric_Score", "OOS_FP_Rate", "InScope_Handoff_Rate"):
            assert row[name] == pytest.approx(expected[name], abs=1e-12), (row[MIN_SCORE_PARAM], name)
    chosen = brute_force(qs, qrels, responses, failed, 0.6, solution.values[MIN_SCORE_PARAM])
    assert solution.metrics["NDCG@20"] == pytest.approx(chosen["NDCG@20"], abs=1e-12)


def renamed(gates):
    return [GateRange({CONFIDENCE_PARAM: RENAMED[0], MIN_SCORE_PARAM: RENAMED[1]}[g.param], g.low, g.high, g.step,
                      role=g.role) for g in gates]


@pytest.mark.parametrize(("seed", "gates"), [
    (0, [GateRange(CONFIDENCE_PARAM, 0.2, 0.8, 0.05), GateRange(MIN_SCORE_PARAM, 0.0, 0.6, 0.1)]),
    (1, [GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01)]),
    (2, [GateRange(MIN_SCORE_PARAM, 0.0, 0.6, 0.05)]),
])
def test_a_renamed_gate_is_solved_and_reported_like_the_reference_key(seed, gates):
    qs, qrels, responses, failed = synthetic_batch(seed)
    retrieval = Retrieval.from_batch(evaluate_responses(qs, qrels, responses, failed))
    ref = solve(retrieval, gates, constraints=[MaxFP(0.3)])
    other = solve(retrieval, renamed(gates), constraints=[MaxFP(0.3)])
    assert other.by_role == ref.by_role and len(ref.by_role) == len(gates)
    assert other.values == {RENAMED[0 if g.role == "confidence" else 1]: ref.values[g.param] for g in gates}
    assert (other.objective, other.violation, other.feasible) == (ref.objective, ref.violation, ref.feasible)
    assert other.metrics == ref.metrics
    # The sweep names its gate columns by the keys solved, and only those.
    columns = {CONFIDENCE_PARAM: RENAMED[0], MIN_SCORE_PARAM: RENAMED[1]}
    assert [c for c in other.table.columns if c.startswith("rag.")] == [columns[g.param] for g in gates]
    assert not {CONFIDENCE_PARAM, MIN_SCORE_PARAM} & set(other.table.columns)
    assert other.table.equals(ref.table.rename(columns=columns))


def test_a_gated_space_with_renamed_keys_gives_roled_gates(tmp_path):
    from tuner.config.space.loading import load_space
    from tuner.study.gates.threshold import retrieval_values, solvable_gates, solve_batch

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "params:\n"
        "  rag.min_confidence: {type: float, low: 0.2, high: 0.8, step: 0.05, gate: confidence}\n"
        "  rag.cutoff: {type: float, low: 0.0, high: 0.6, step: 0.1, gate: min_score}\n"
    )
    gates = solvable_gates(load_space(space_file))
    assert gates == [GateRange("rag.cutoff", 0.0, 0.6, 0.1, "min_score"),
                     GateRange("rag.min_confidence", 0.2, 0.8, 0.05, "confidence")]
    assert retrieval_values(gates) == {"rag.cutoff": 0.0, "rag.min_confidence": 0.2}
    qs, qrels, responses, failed = synthetic_batch(7)
    batch = evaluate_responses(qs, qrels, responses, failed)
    reference = [GateRange(CONFIDENCE_PARAM, 0.2, 0.8, 0.05), GateRange(MIN_SCORE_PARAM, 0.0, 0.6, 0.1)]
    assert solve_batch(batch, gates).by_role == solve_batch(batch, reference).by_role


@pytest.mark.parametrize(("role", "unmapped"), [("confidence", {"confidence": None}), ("min_score", {"score": None})])
def test_a_gate_needs_its_response_field_mapped(role, unmapped):
    from tuner.evaluation.spec import ResponseMapping
    from tuner.study.gates.threshold import check_gate_mapping

    gate = GateRange("rag.gate", 0.0, 0.5, role=role)
    check_gate_mapping([gate], ResponseMapping(confidence="conf", score="s"))
    check_gate_mapping([], ResponseMapping(confidence=None, score=None))  # nothing to solve, nothing needed
    field = next(iter(unmapped))
    with pytest.raises(ConfigError) as exc:
        check_gate_mapping([gate], ResponseMapping(**({"confidence": "conf", "score": "s"} | unmapped)),
                           where="exp.yaml: ")
    message = str(exc.value)
    assert message.startswith(f"exp.yaml: rag.gate: gate: {role} reads the response's {field}")
    assert f"evaluation.response.{field} is not mapped; set it" in message and "\n" not in message
