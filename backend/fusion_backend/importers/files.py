"""The common case in one import: a corpus file, a queries file, a qrels file, runs.

``python -m fusion_backend.importers files --name NAME --corpus F --queries F --qrels F
[--run NAME=PATH ...] [--oos F] --out DIR``. Each input's format is told by its extension
or first line (corpusfiles, queryfiles, qrelfiles, runfiles). On top of the per-file
checks, ids must meet: judged queries must be in the query file, judged documents and
every run's documents in the corpus, every run's queries in the query file. A file
that shares no id at all with the others stops the import with a few ids of each, the
usual cause being an id format mismatch ("D123" vs "123"). Judgments of queries that
are not in the query file are left out and counted (qrels often cover more queries
than the query file, as MS MARCO's do).

Without ``--corpus`` the corpus is the passages the runs carry (JSON / JSONL hits with
``text`` / ``contents`` / ...; runfiles.py): one document per doc id, the first passage
seen. Out-of-scope queries that no run ranks get no candidates from a runs-only config
(the backend hands them off under every config, so OOS_FP_Rate cannot vary): the
manifest lists them (``oos_without_candidates``) and the summary warns.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .corpusfiles import read_corpus_file
from .dataset import Dataset, Document, Judgment, Query
from .errors import DataFormatError
from .grades import GradeMap
from .qrelfiles import parse_qrels
from .queryfiles import read_query_file
from .runfiles import ConvertedRuns, convert_runs
from .trec import QueryField, grade_qrels
from .unjudged import Policy, apply_policy

SHORT_MAX_WORDS = 6
OOS_SOURCE = "oos"


def import_files(
    name: str,
    corpus: Path | None,
    queries: Path,
    qrels: Path,
    *,
    runs: list[str] | None = None,
    oos: Path | None = None,
    grade_map: GradeMap | None = None,
    unjudged: Policy = "drop",
    query_field: QueryField = "title",
    short_max_words: int = SHORT_MAX_WORDS,
    with_lexical: bool = False,
) -> tuple[Dataset, dict[str, str]]:
    """The bundle plus its extra files (``runs/<name>.run`` -> text). ``corpus`` None:
    the runs' passages; ``with_lexical``: the config serves bm25 + dense next to the runs
    (so every query gets candidates)."""
    asked = read_query_file(queries, source=name, scope="in", short_max_words=short_max_words, query_field=query_field)
    extra = (
        read_query_file(oos, source=OOS_SOURCE, scope="oos", short_max_words=short_max_words, query_field=query_field)
        if oos
        else []
    )
    _check_distinct(asked, extra, oos)
    all_queries = asked + extra
    judgments, used_map, orphans = _judgments(qrels, grade_map, all_queries)
    kept = apply_policy(all_queries, judgments, unjudged, qrels)
    converted = convert_runs(runs or [], [q.query_id for q in kept.queries])
    documents = read_corpus_file(corpus) if corpus is not None else _run_passages(converted)
    _require_overlap(
        (j.doc_id for j in judgments),
        (d.doc_id for d in documents),
        qrels,
        "judged doc ids",
        "the corpus",
        "pass the corpus these qrels judge",
    )
    _check_runs(converted, documents, all_queries)
    manifest = {
        "source": {
            "corpus": str(corpus) if corpus is not None else "the runs' passages",
            "queries": str(queries),
            "qrels": str(qrels),
            "oos": str(oos) if oos else None,
            "runs": {n: str(p) for n, p in converted.sources.items()},
        },
        "grade_mapping": {"name": used_map.name, "codes": used_map.describe()},
        "query_type_rule": f"short: <= {short_max_words} words, else long_tail; --oos queries off_topic",
        "unjudged": kept.manifest(),
        "judgments_of_unknown_queries_left_out": orphans,
        "runs": converted.paths,
    }
    if corpus is None:
        manifest["corpus_from_runs"] = len(documents)
    if converted.lines and not with_lexical:
        ranked = converted.ranked_queries()
        manifest["oos_without_candidates"] = [
            q.query_id for q in kept.queries if q.scope == "oos" and q.query_id not in ranked
        ]
    return Dataset(name, documents, kept.queries, judgments, manifest), converted.files


def _run_passages(converted: ConvertedRuns) -> list[Document]:
    """The corpus the runs carry: one document per doc id with passage text, in run order."""
    passages = converted.passages()
    if not passages:
        where = ", ".join(str(p) for p in converted.sources.values()) or "--run"
        raise DataFormatError.at(
            where,
            None,
            "no --corpus given and no run hit carries passage text (text, contents, content, passage or raw)",
            "pass the corpus file to --corpus, or runs whose hits hold their passages",
        )
    return [Document(doc_id, line.title or "", line.text or "") for doc_id, line in passages.items()]


def _check_distinct(asked: list[Query], extra: list[Query], oos: Path | None) -> None:
    clash = sorted({q.query_id for q in asked} & {q.query_id for q in extra})
    if clash:
        raise DataFormatError.at(
            oos or "--oos",
            None,
            f"{len(clash)} out-of-scope query ids are also in --queries, e.g. {clash[0]!r}",
            "give the out-of-scope queries their own ids (e.g. prefix them with oos-), in the runs as well",
        )


def _judgments(qrels: Path, grade_map: GradeMap | None, queries: list[Query]) -> tuple[list[Judgment], GradeMap, int]:
    raw = parse_qrels(qrels)
    if not raw:
        raise DataFormatError.at(qrels, None, "no judgments", "pass the qrels file to --qrels")
    _require_overlap(
        (r.query_id for r in raw),
        (q.query_id for q in queries),
        qrels,
        "judged query ids",
        "--queries",
        "pass the queries these qrels judge",
    )
    judgments, used_map = grade_qrels(qrels, raw, grade_map)
    known = {q.query_id for q in queries}
    kept = [j for j in judgments if j.query_id in known]
    return kept, used_map, len(judgments) - len(kept)


def _check_runs(converted: ConvertedRuns, documents: list[Document], queries: list[Query]) -> None:
    doc_ids, query_ids = [d.doc_id for d in documents], [q.query_id for q in queries]
    for name, lines in converted.lines.items():
        path, fix = converted.sources[name], f"pass the run made on this corpus and these queries as --run {name}=PATH"
        _require_overlap((r.query_id for r in lines), query_ids, path, "query ids", "--queries", fix)
        _require_overlap((r.doc_id for r in lines), doc_ids, path, "doc ids", "the corpus", fix)


def _require_overlap(ids: Iterable[str], known: Iterable[str], path: Path, what: str, where: str, fix: str) -> None:
    """Stop when no id of ``ids`` is in ``known``: an id format mismatch, not missing data."""
    mine, theirs = list(dict.fromkeys(ids)), list(dict.fromkeys(known))
    if set(mine) & set(theirs):
        return
    raise DataFormatError.at(
        path,
        None,
        f"none of its {len(mine)} {what} is in {where} (its: {_few(mine)}; {where}: {_few(theirs)})",
        f"{fix} (ids must match exactly)",
    )


def _few(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids[:3]) + (", ..." if len(ids) > 3 else "")
