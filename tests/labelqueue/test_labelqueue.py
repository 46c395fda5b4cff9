"""The labelling queue: pooling, priority, export, partial re-import."""

from __future__ import annotations

import csv
import json

import optuna
import pytest

from tuner.data.labels import LabelStore
from tuner.errors import InputError
from tuner.ops.labelqueue import (
    TrialReport,
    build_queue,
    import_graded,
    load_trial_report,
    pick_trials,
    report_of,
    write_queue,
)
from tuner.study.trial.attrs import ATTR_REPORTS, ATTR_VARIANT, set_record

QUERIES = {"q1": "wing flutter", "q2": "boundary layer"}


def reports():
    return [
        TrialReport(3, [{"query_id": "q1", "rank": 2, "doc_id": "d9", "title": "Flutter\nof wings"},
                        {"query_id": "q1", "rank": 12, "doc_id": "d5", "title": "deep"},
                        {"query_id": "q2", "rank": 1, "doc_id": "d7", "title": "BL"}], QUERIES),
        TrialReport(8, [{"query_id": "q1", "rank": 5, "doc_id": "d9", "title": None},
                        {"query_id": "q2", "rank": 4, "doc_id": "d8", "title": "other"},
                        {"query_id": "q2", "rank": 3, "doc_id": "d1", "title": "judged already"}], QUERIES),
    ]


def test_queue_pools_dedups_and_orders_by_trials_then_rank():
    items = build_queue(reports(), k=10, qrels={"q2": {"d1": 2}})
    keys = [(i.query_id, i.doc_id) for i in items]
    # d9 is shown by both trials; then single-trial hits by best rank; d5 is deeper than k; d1 is judged.
    assert keys == [("q1", "d9"), ("q2", "d7"), ("q2", "d8")]
    first = items[0]
    assert (first.best_rank, first.trials, first.title, first.query) == (2, [3, 8], "Flutter of wings", "wing flutter")
    assert [i.doc_id for i in build_queue(reports(), k=20)][-1] == "d5"
    with pytest.raises(InputError):
        build_queue(reports(), k=0)


def test_csv_round_trip_imports_only_graded_rows(tmp_path):
    out = tmp_path / "queue.csv"
    assert write_queue(build_queue(reports()), out) == 4
    rows = list(csv.DictReader(out.open()))
    assert [r["doc_id"] for r in rows] == ["d9", "d7", "d1", "d8"]  # d1 (rank 3) before d8 (rank 4)
    assert rows[0]["n_trials"] == "2" and rows[0]["relevance"] == ""
    rows[0]["relevance"], rows[3]["relevance"] = "3", "0"
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    store = LabelStore(tmp_path / "labels.db")
    summary, left = import_graded(store, out, "ds")
    assert summary is not None and summary.n_labels == 2 and left == 2
    assert store.qrels("ds") == {"q1": {"d9": 3}, "q2": {"d8": 0}}
    again = build_queue(reports(), qrels=store.qrels("ds"))
    assert [(i.query_id, i.doc_id) for i in again] == [("q2", "d7"), ("q2", "d1")]


def test_jsonl_round_trip(tmp_path):
    out = tmp_path / "queue.jsonl"
    write_queue(build_queue(reports()), out)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [rec["query_id"] for rec in lines] == ["q1", "q2"]
    lines[1]["judgments"][0]["relevance"] = 2
    out.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    store = LabelStore(tmp_path / "labels.db")
    summary, left = import_graded(store, out, "ds")
    assert summary.n_labels == 1 and left == 3
    assert store.qrels("ds") == {"q2": {lines[1]["judgments"][0]["doc_id"]: 2}}


def test_bad_grade_names_the_real_file_and_line_and_imports_nothing(tmp_path):
    out = tmp_path / "queue.csv"
    write_queue(build_queue(reports()), out)
    lines = out.read_text().splitlines()
    lines[1] = lines[1] + "3"
    lines[3] = lines[3] + "7"
    out.write_text("\n".join(lines) + "\n")
    store = LabelStore(tmp_path / "labels.db")
    with pytest.raises(InputError, match=f"{out}:4"):
        import_graded(store, out, "ds")
    assert store.datasets() == []
    summary, left = import_graded(LabelStore(tmp_path / "l2.db"), _blank_queue(tmp_path), "ds")
    assert summary is None and left == 4


def _blank_queue(tmp_path):
    out = tmp_path / "blank.csv"
    write_queue(build_queue(reports()), out)
    return out


def test_pick_trials_takes_best_feasible_plus_baseline_and_reads_reports(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    values = [0.5, 0.9, 0.7, 0.95, 0.6]
    fp = [0.0, 0.0, 0.0, 0.3, 0.0]  # trial 3 is best but infeasible
    for n, (v, f) in enumerate(zip(values, fp)):
        t = study.ask()
        t.set_constraint("OOS_FP_Rate <= 0.1", f - 0.1)
        if n == 0:
            t.set_user_attr(ATTR_VARIANT, "baseline")
        path = tmp_path / f"t{n}.json"
        path.write_text(json.dumps({"context": {"dataset_id": "ds"}, "queries": [{"query_id": "q1", "query": "x"}],
                                    "unjudged": [{"query_id": "q1", "rank": 1, "doc_id": f"d{n}", "title": "t"}]}))
        if n == 0:  # as a study written before records existed kept it: read the same
            t.set_user_attr(ATTR_REPORTS, {"json": str(path)})
        else:
            set_record(t, ATTR_REPORTS, {"json": str(path)})
        study.tell(t, v)
    picked = pick_trials(study.trials, top_n=2)
    assert [t.number for t in picked] == [1, 2, 0]
    assert [t.number for t in pick_trials(study.trials, top_n=2, include_baseline=False)] == [1, 2]
    loaded = [load_trial_report(t.number, report_of(t)) for t in picked]
    assert loaded[0].dataset_id == "ds" and loaded[0].queries == {"q1": "x"}
    assert [i.doc_id for i in build_queue(loaded)] == ["d0", "d1", "d2"]
    with pytest.raises(InputError, match="missing"):
        load_trial_report(9, tmp_path / "nope.json")
