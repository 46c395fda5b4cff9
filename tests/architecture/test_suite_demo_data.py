"""support/demo_data.py: the demo data set generated once per run, copied byte for byte
as ``write_demo`` writes it, regenerated when the generator's source changes."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
import support.demo_data as demo_data

from fusion_backend.datagen import write_demo


def test_a_copy_is_what_the_generator_writes_and_the_second_copy_reuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(demo_data.DEMO_DATA_ENV, str(tmp_path / "cache"))
    write_demo(tmp_path / "generated")
    first = demo_data.copy_demo_data(tmp_path / "one")
    for name in demo_data.FILES:
        assert filecmp.cmp(tmp_path / "generated" / name, first / name, shallow=False), name

    def no_generation(*args: object) -> None:
        raise AssertionError("generated again although cached")

    monkeypatch.setattr("fusion_backend.datagen.write_demo", no_generation)
    second = demo_data.copy_demo_data(tmp_path / "two")
    (second / "queries.jsonl").write_text("cut by a test\n")  # a copy: the cache is untouched
    third = demo_data.copy_demo_data(tmp_path / "three")
    assert filecmp.cmp(first / "queries.jsonl", third / "queries.jsonl", shallow=False)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [demo_data.cached_demo_data().name]


def test_a_changed_generator_or_seed_is_another_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    key = demo_data._key(7)
    assert demo_data._key(8) != key
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b"#" if self.name == "catalog.py" else b""))
    assert demo_data._key(7) != key
