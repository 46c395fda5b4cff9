"""A label import that fails leaves nothing that looks like labels: no empty label
store, and never the first of several label files stored alone (the next run would
take it for the whole set and not import again)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.test_study_e2e import demo_data, make_project  # noqa: F401  (module fixture reused)

from tuner.config.experiment import load_experiment
from tuner.data.labels import LabelStore
from tuner.errors import TunerError
from tuner.study.wiring import load_dataset


def _experiment(root: Path, data: Path, labels: list[dict]) -> object:
    return load_experiment(make_project(root, data, study="labels", n_trials=1,
                                        dataset={"labels": labels}, tracking={"enabled": False}))


def test_a_bad_second_label_file_stores_no_labels_and_no_empty_store(demo_data: Path,  # noqa: F811
                                                                      tmp_path: Path) -> None:
    (bad := tmp_path / "bad.txt").write_text("q1 0 d1 not-a-grade\n")
    exp = _experiment(tmp_path / "p", demo_data, [{"path": "data/qrels.txt", "format": "qrels"},
                                                  {"path": str(bad), "format": "qrels"}])
    with pytest.raises(TunerError, match="bad.txt"):
        load_dataset(exp)
    assert not exp.dataset.labels_db.exists()


def test_a_bad_label_file_leaves_an_existing_store_without_the_dataset(demo_data: Path,  # noqa: F811
                                                                        tmp_path: Path) -> None:
    (bad := tmp_path / "bad.txt").write_text("q1 0 d1 not-a-grade\n")
    exp = _experiment(tmp_path / "p", demo_data, [{"path": "data/qrels.txt", "format": "qrels"},
                                                  {"path": str(bad), "format": "qrels"}])
    store = LabelStore(exp.dataset.labels_db)
    store.import_file(demo_data / "qrels.txt", "other-set", fmt="qrels")  # a store in use for another set
    with pytest.raises(TunerError, match="bad.txt"):
        load_dataset(exp)
    assert store.datasets() == ["other-set"]
