"""Mapping a collection's relevance codes onto the tuner's grades 0..3.

Grades: 3 Fully, 2 Mostly, 1 Weakly, 0 Irrelevant. Each importer documents its
default mapping (docs/data.md); users override it with ``--grade-map "2:3,1:2,0:0"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import DataFormatError

# Cleverdon's Cranfield codes: 1 complete answer, 2 high relevance, 3 useful background,
# 4 minimum interest; -1 marks a pair judged of no interest.
CLEVERDON = {1: 3, 2: 2, 3: 1, 4: 1, -1: 0}


@dataclass(frozen=True)
class GradeMap:
    """Raw relevance code -> grade; ``name`` says where the mapping came from."""

    mapping: Mapping[int, int]
    name: str

    def grade(self, raw: int, path: Path | str, line: int) -> int:
        try:
            return self.mapping[raw]
        except KeyError:
            known = ", ".join(f"{k}->{v}" for k, v in sorted(self.mapping.items()))
            example = ",".join([f"{raw}:0", *(f"{k}:{v}" for k, v in sorted(self.mapping.items()))])
            raise DataFormatError.at(
                path,
                line,
                f"relevance code {raw} has no grade in the {self.name} mapping ({known})",
                f'pass --grade-map with an entry for it, e.g. --grade-map "{example}"',
            ) from None

    def describe(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.mapping.items())}


def parse_grade_map(spec: str) -> GradeMap:
    """Parse ``"2:3,1:2,0:0"``; grades must be 0..3."""
    mapping: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        raw, sep, grade = item.partition(":")
        try:
            code, value = int(raw), int(grade)
        except ValueError:
            value = -1
        if not sep or value not in (0, 1, 2, 3):
            raise DataFormatError.at(
                "--grade-map",
                None,
                f"entry {item!r} is not CODE:GRADE with GRADE in 0..3",
                'write it like --grade-map "2:3,1:2,0:0"',
            )
        mapping[code] = value
    if not mapping:
        raise DataFormatError.at("--grade-map", None, "empty mapping", 'write it like --grade-map "2:3,1:2,0:0"')
    return GradeMap(mapping, "--grade-map")


def auto_grade_map(raw_codes: Iterable[int], source: Path | str) -> GradeMap:
    """Pick a mapping from the codes present.

    The highest positive code means "answers the query" and maps to 3 (Fully); lower
    positive codes keep their number (so binary 1 -> 3, TREC-COVID's 0..2 gives
    1 -> 1, 2 -> 3, and 0..3 data maps to itself). The top grade for binary data keeps
    NDCG equal to binary NDCG. Zero and negative codes (TREC's "junk") map to 0.
    Codes above 3 need an explicit --grade-map.
    """
    codes = set(raw_codes)
    positive = {c for c in codes if c > 0}
    top = max(positive, default=0)
    if top > 3:
        raise DataFormatError.at(
            source,
            None,
            f"relevance codes go up to {top}, above grade 3",
            'pass --grade-map to say which grade each code means, e.g. "4:3,3:2,2:1,1:1,0:0"',
        )
    mapping = {c: 0 for c in codes if c <= 0}
    mapping.update({c: (3 if c == top else c) for c in positive})
    return GradeMap(mapping, f"auto (top code {top} -> 3)" if positive else "auto (no positive codes)")
