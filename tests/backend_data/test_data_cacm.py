"""CACM importer on the real shared collection (skips without ../shared, fails in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fusion_backend.importers import import_cacm
from fusion_backend.importers.cacm import issue_date
from fusion_backend.importers.errors import DataFormatError


@pytest.fixture(scope="module")
def cacm_dir(datasets_dir: Path) -> Path:
    return datasets_dir / "cacm"


@pytest.fixture(scope="module")
def cacm(cacm_dir: Path):
    return import_cacm(cacm_dir)


def test_counts(cacm, cacm_dir):
    raw_qrels = [line.split() for line in (cacm_dir / "qrels.text").read_text().splitlines() if line.strip()]
    assert len(cacm.documents) == 3204
    assert len(cacm.queries) == 64
    assert len(cacm.judgments) == len({(int(q), int(d)) for q, d, *_ in raw_qrels}) == 796
    judged = {int(q) for q, *_ in raw_qrels}
    assert cacm.counts()["queries_in_scope_without_relevant"] == 64 - len(judged) == 12


def test_doc_ids_are_complete_even_where_an_id_wraps(cacm):
    # cacm.all writes record 2856 as ".I 28" followed by a line "56".
    assert [d.doc_id for d in cacm.documents] == [str(i) for i in range(1, 3205)]
    assert cacm.documents[2855].title == "The Synthetic Approach to Decision Table Conversion"


def test_every_document_gets_its_issue_month(cacm, cacm_dir):
    notes = re.findall(r"^\.B\n(.*?)\n", (cacm_dir / "cacm.all").read_text(), flags=re.M)
    assert len(notes) == 3204
    assert [d.date for d in cacm.documents] == [issue_date(n) for n in notes]
    assert cacm.documents[0].date == "1958-12-01"  # "CACM December, 1958"
    assert all(d.date is not None and "1958-01-01" <= d.date <= "1979-12-01" for d in cacm.documents)


@pytest.mark.parametrize(("note", "expected"), [
    ("CACM December, 1958", "1958-12-01"),
    ("CACM November,1960", "1960-11-01"),
    ("June, 1969", "1969-06-01"),
    ("CACM JUly 1973", "1973-07-01"),
    ("no date here", None),
])
def test_issue_date_variants(note, expected):
    assert issue_date(note) == expected


def test_binary_relevance_maps_to_one_grade(cacm_dir, cacm):
    assert {j.grade for j in cacm.judgments} == {3}
    assert {j.grade for j in import_cacm(cacm_dir, relevant_grade=2).judgments} == {2}
    with pytest.raises(DataFormatError, match="--relevant-grade"):
        import_cacm(cacm_dir, relevant_grade=0)


def test_zero_padded_query_ids_are_normalised(cacm, cacm_dir):
    first = (cacm_dir / "qrels.text").read_text().split()[:2]
    assert first[0] == "01"
    assert ("1", str(int(first[1]))) in {(j.query_id, j.doc_id) for j in cacm.judgments}
    assert [q.query_id for q in cacm.queries] == [str(i) for i in range(1, 65)]
    assert not any("\r" in q.query for q in cacm.queries)
