"""Run sources: precomputed TREC run files, looked up by the request's ``query_id``.

A run line is ``qid Q0 docno rank score tag``. Like trec_eval, the order is score
descending with ties broken by docno descending; the rank column is ignored.
Documents that are not in the corpus are dropped (they have no title, date or
embedding); how many is reported at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CorpusError


@dataclass(frozen=True)
class RunTable:
    """Per query id: document indices in rank order and their run scores."""

    rankings: dict[str, tuple[np.ndarray, np.ndarray]]
    dropped: int  # lines naming a doc_id absent from the corpus

    def lookup(self, query_id: str | None) -> tuple[np.ndarray, np.ndarray]:
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        if query_id is None:
            return empty
        return self.rankings.get(str(query_id), empty)


def read_run(path: Path, doc_index: dict[str, int]) -> RunTable:
    per_query: dict[str, list[tuple[float, str]]] = {}
    dropped = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != 6:
                    raise CorpusError(
                        f"{path}:{lineno}: a TREC run line has 6 columns 'qid Q0 docno rank score tag' "
                        f"(got {len(parts)})"
                    )
                qid, _, docno, _, score, _ = parts
                try:
                    value = float(score)
                except ValueError as exc:
                    raise CorpusError(f"{path}:{lineno}: score {score!r} is not a number") from exc
                if docno not in doc_index:
                    dropped += 1
                    continue
                per_query.setdefault(qid, []).append((value, docno))
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read run file: {exc.strerror}") from exc
    rankings = {}
    for qid, entries in per_query.items():
        entries.sort(reverse=True)  # score desc, then docno desc (trec_eval's order)
        seen: set[str] = set()
        best = []  # keep a doc's best line
        for e in entries:
            if e[1] not in seen:
                seen.add(e[1])
                best.append(e)
        entries = best
        rankings[qid] = (
            np.fromiter((doc_index[d] for _, d in entries), dtype=np.int64, count=len(entries)),
            np.fromiter((s for s, _ in entries), dtype=np.float64, count=len(entries)),
        )
    return RunTable(rankings, dropped)
