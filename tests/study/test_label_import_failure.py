"""A label import that fails leaves nothing that looks like labels: no empty label
store, and never the first of several label files stored alone (the next run would
take it for the whole set and not import again)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.test_study_e2e import demo_data, make_project  # noqa: F401  (module fixture reused)

from tuner.config.experiment import load_experiment
from tuner.data.labels import LabelStore
from tuner.errors import LabelError, TunerError
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


def test_a_label_file_edited_after_the_import_stops_load_dataset_until_replaced(demo_data: Path,  # noqa: F811
                                                                                tmp_path: Path) -> None:
    exp = _experiment(tmp_path / "p", demo_data, [{"path": "data/qrels.txt", "format": "qrels"}])
    _, qrels, fingerprint, _ = load_dataset(exp)
    path = tmp_path / "p" / "data" / "qrels.txt"
    lines = path.read_text().splitlines(keepends=True)
    dropped = lines.pop(1).split()
    path.write_text("".join(lines))
    with pytest.raises(LabelError, match=r"data/qrels.txt changed since it was imported into .*: "
                                         r"0 judgment\(s\) added, 0 changed, 1 removed; re-import it with "
                                         r"`tuner labels import \S+qrels.txt --replace --dataset-id demo"):
        load_dataset(exp)
    assert LabelStore(exp.dataset.labels_db).qrels("demo") == qrels  # nothing changed behind the user's back
    LabelStore(exp.dataset.labels_db).import_file(path, "demo", fmt="qrels", replace=True)
    _, now, now_fingerprint, _ = load_dataset(exp)
    assert dropped[2] not in now.get(dropped[0], {}) and now_fingerprint != fingerprint


def test_a_label_file_declared_after_the_first_import_is_not_taken_silently(demo_data: Path,  # noqa: F811
                                                                            tmp_path: Path) -> None:
    exp = _experiment(tmp_path / "p", demo_data, [{"path": "data/qrels.txt", "format": "qrels"}])
    load_dataset(exp)
    (extra := tmp_path / "more.txt").write_text("q-new 0 d-new 3\n")
    exp_file = tmp_path / "p" / "experiment.yaml"
    text = exp_file.read_text()
    declared = "  - {path: data/qrels.txt, format: qrels}\n"
    assert declared in text
    exp_file.write_text(text.replace(declared, declared + f"  - {{path: {extra}}}\n"))
    with pytest.raises(LabelError, match=r"more.txt was never imported into .*: 1 judgment\(s\) added"):
        load_dataset(load_experiment(exp_file))
