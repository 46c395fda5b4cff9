"""``python -m fusion_backend.importers cranfield|cacm|trec|beir|files ... --out DIR``.

A summary on success (counts, unjudged queries dropped or kept, the next command), one
``error:`` line (file:line, problem, fix) and exit code 2 on bad input, printed by
``fusion_backend.cli.run_data_tool``. Every import writes the data bundle and
the ready config / space / experiment (ready.py) in one all-or-nothing write, after
checking that no ready file was edited since the last import (edits.py; ``--force``
backs the edited ones up and overwrites them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..cli import run_data_tool
from . import cacm, cranfield, files, trec
from .beir import import_beir
from .cacm import import_cacm
from .cranfield import import_cranfield
from .dataset import Dataset, write_dataset
from .edits import BACKUP_DIR, RECORD_KEY, back_up, find_edited, record, refusal
from .errors import DataFormatError
from .files import import_files
from .grades import GradeMap, parse_grade_map
from .ready import EXPERIMENT_FILE, REPLAY_FILE, ready_files
from .trec import import_trec
from .unjudged import POLICIES, describe

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _grade_map(spec: str | None) -> GradeMap | None:
    return parse_grade_map(spec) if spec else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fusion_backend.importers",
        description="Import a test collection as corpus.jsonl + NAME.queries.jsonl + NAME.qrels.txt (+ manifest.json),"
        " plus a ready config.yaml, space.yaml and experiment.yaml for `tuner run`.",
    )
    sub = parser.add_subparsers(dest="collection", required=True)

    def command(name: str, help_text: str, short_default: int) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--out", type=Path, required=True, help="output directory (created; files replaced atomically)")
        p.add_argument(
            "--force",
            action="store_true",
            help="overwrite ready files (config.yaml, space.yaml, experiment*.yaml) edited since the last "
            f"import, after copying them to OUT/{BACKUP_DIR}/<UTC time>/",
        )
        p.add_argument(
            "--short-max-words",
            type=int,
            default=short_default,
            help=f"queries with at most this many words are 'short', longer ones 'long_tail' (default {short_default})",
        )
        if name != "files":
            p.add_argument("--name", help=f"data set name: NAME.queries.jsonl, dataset id, study (default {name})")
        return p

    def runs_and_policy(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--run",
            action="append",
            default=[],
            metavar="NAME=PATH",
            help="run file (TREC, JSONL or JSON array) served as source NAME from OUT/runs/NAME.run (repeatable)",
        )
        p.add_argument(
            "--with-lexical",
            action="store_true",
            help="serve bm25 + dense next to the runs (without --run they are always served)",
        )
        p.add_argument(
            "--unjudged",
            choices=POLICIES,
            default="drop",
            help="in-scope queries without any judgment: drop (default, counted), keep, or error",
        )
        p.add_argument(
            "--query-field",
            choices=["title", "desc", "title+desc"],
            default="title",
            help="text of TREC <top> topics used as the query (default title)",
        )

    p = command("cranfield", "Cranfield 1400 (cran.all.1400, cran.qry, cranqrel)", cranfield.SHORT_MAX_WORDS)
    p.add_argument("--src", type=Path, required=True, help="directory holding the Cranfield files")
    p.add_argument("--grade-map", help='Cleverdon code -> grade, default "1:3,2:2,3:1,4:1,-1:0"')
    p.add_argument(
        "--oos-from-cacm",
        type=int,
        default=0,
        metavar="N",
        help="append the first N CACM queries as out-of-scope (scope oos) queries",
    )
    p.add_argument("--cacm-src", type=Path, help="CACM directory for --oos-from-cacm (default: SRC/../cacm)")

    p = command("cacm", "CACM (cacm.all, query.text, qrels.text)", cacm.SHORT_MAX_WORDS)
    p.add_argument("--src", type=Path, required=True, help="directory holding the CACM files")
    p.add_argument("--relevant-grade", type=int, default=3, help="grade of a judged-relevant document (default 3)")

    p = command("trec", "TREC topics + qrels (+ SGML documents, run files)", trec.SHORT_MAX_WORDS)
    p.add_argument("--topics", type=Path, required=True, help="topics file (<top> SGML, or qid<TAB>text)")
    p.add_argument("--qrels", type=Path, required=True, help="qrels file 'qid iter docno rel'")
    p.add_argument("--docs", type=Path, nargs="*", default=[], help="TREC SGML document files (.gz allowed)")
    p.add_argument("--grade-map", help='relevance code -> grade, e.g. "2:3,1:2,0:0" (default: auto)')
    p.add_argument("--source", default="trec", help="value of the queries' 'source' field")
    runs_and_policy(p)

    p = command("beir", "BEIR layout (corpus.jsonl, queries.jsonl, qrels/*.tsv)", 6)
    p.add_argument("--src", type=Path, required=True, help="BEIR dataset directory")
    p.add_argument("--splits", help="comma-separated qrels splits to import (default: all)")
    p.add_argument("--grade-map", help='qrels score -> grade, e.g. "2:3,1:1,0:0" (default: auto)')

    p = command("files", "a corpus file + a queries file + a qrels file (+ runs)", files.SHORT_MAX_WORDS)
    p.add_argument("--name", required=True, help="data set name: NAME.queries.jsonl, dataset id, study")
    p.add_argument(
        "--corpus",
        type=Path,
        help="JSONL {doc_id|_id|id, title, text|contents, date?} or TSV doc_id<TAB>[title<TAB>]text "
        "(default: the passages the JSON/JSONL runs carry)",
    )
    p.add_argument(
        "--queries",
        type=Path,
        required=True,
        help="JSONL {query_id|_id|qid, query|text}, TSV qid<TAB>text, TREC <top> topics, or SMART "
        "(.I id / .W text, as CACM's query.text)",
    )
    p.add_argument(
        "--qrels",
        type=Path,
        required=True,
        help="TREC 'qid iter docno rel' or 'qid docno rel', BEIR TSV with header, or JSONL "
        "{query_id, doc_id, relevance}",
    )
    p.add_argument("--oos", type=Path, help="extra queries (same formats) added with scope oos")
    p.add_argument("--grade-map", help='relevance code -> grade, e.g. "2:3,1:2,0:0" (default: auto)')
    runs_and_policy(p)
    return parser


def _cranfield(args: argparse.Namespace) -> tuple[Dataset, dict[str, str]]:
    return import_cranfield(
        args.src,
        grade_map=_grade_map(args.grade_map),
        short_max_words=args.short_max_words,
        oos_from_cacm=args.oos_from_cacm,
        cacm_src=args.cacm_src,
    ), {}


def _cacm(args: argparse.Namespace) -> tuple[Dataset, dict[str, str]]:
    return import_cacm(args.src, relevant_grade=args.relevant_grade, short_max_words=args.short_max_words), {}


def _trec(args: argparse.Namespace) -> tuple[Dataset, dict[str, str]]:
    return import_trec(
        args.topics,
        args.qrels,
        docs=args.docs,
        runs=args.run,
        query_field=args.query_field,
        grade_map=_grade_map(args.grade_map),
        short_max_words=args.short_max_words,
        source=args.source,
        unjudged=args.unjudged,
    )


def _beir(args: argparse.Namespace) -> tuple[Dataset, dict[str, str]]:
    splits = [s.strip() for s in args.splits.split(",")] if args.splits else None
    return import_beir(
        args.src, splits=splits, grade_map=_grade_map(args.grade_map), short_max_words=args.short_max_words
    ), {}


def _files(args: argparse.Namespace) -> tuple[Dataset, dict[str, str]]:
    return import_files(
        _checked_name(args.name),
        args.corpus,
        args.queries,
        args.qrels,
        runs=args.run,
        oos=args.oos,
        grade_map=_grade_map(args.grade_map),
        unjudged=args.unjudged,
        query_field=args.query_field,
        short_max_words=args.short_max_words,
        with_lexical=args.with_lexical,
    )


IMPORTERS: dict[str, Callable[[argparse.Namespace], tuple[Dataset, dict[str, str]]]] = {
    "cranfield": _cranfield,
    "cacm": _cacm,
    "trec": _trec,
    "beir": _beir,
    "files": _files,
}


def _checked_name(name: str) -> str:
    """The name becomes file names, the dataset id and the study name: keep it plain."""
    if not _NAME.fullmatch(name):
        raise DataFormatError.at(
            "--name",
            None,
            f"data set name {name!r} is not [A-Za-z][A-Za-z0-9_-]*",
            "pass --name with a plain name such as robust04 or my-faq",
        )
    return name


def run(args: argparse.Namespace) -> tuple[Dataset, Path, list[str]]:
    """The import, written; with the notes the summary adds (the backup a --force made)."""
    dataset, extra = IMPORTERS[args.collection](args)
    dataset.name = _checked_name(args.name or dataset.name)
    runs = dataset.manifest.get("runs", {})
    ready = ready_files(dataset, runs, with_lexical=getattr(args, "with_lexical", False))
    notes: list[str] = []
    if edited := find_edited(args.out, ready):
        if not args.force:
            raise refusal(args.out, edited)
        folder = back_up(args.out, edited)
        names = ", ".join(e.name for e in edited)
        kept = "version is" if len(edited) == 1 else "versions are"
        notes.append(f"overwrote the edited {names} (--force); the edited {kept} kept in {folder}/")
    dataset.manifest[RECORD_KEY] = record(ready)  # what the next import compares the files on disk with
    write_dataset(dataset, args.out, {**extra, **ready}, named=True)
    return dataset, args.out, notes


def summary(dataset: Dataset, out: Path, notes: Sequence[str] = ()) -> list[str]:
    counts = dataset.counts()
    lines = [
        f"{dataset.name}: {counts['documents']} documents, {counts['queries']} queries "
        f"({counts['queries_oos']} out of scope), {counts['judgments']} judgments -> {out}"
    ]
    unjudged = dataset.manifest.get("unjudged")
    if unjudged and (line := describe(unjudged)):
        lines.append(line)
    if left_out := dataset.manifest.get("judgments_of_unknown_queries_left_out"):
        lines.append(f"left out {left_out} judgments of queries that are not in --queries")
    if from_runs := dataset.manifest.get("corpus_from_runs"):
        lines.append(f"corpus: the {from_runs} passages the runs carry (no --corpus)")
    if unranked := dataset.manifest.get("oos_without_candidates"):
        shown = ", ".join(unranked[:3]) + (", ..." if len(unranked) > 3 else "")
        lines.append(
            f"warning: {len(unranked)} of {counts['queries_oos']} out-of-scope queries get no candidates "
            f"from any source (no run ranks them: {shown}): the backend hands them off under every "
            "config, so OOS_FP_Rate cannot vary for them; add them to the runs, or pass --with-lexical"
        )
    if counts["judgments_unknown_doc"] and not dataset.manifest.get("corpus_stub"):
        lines.append(f"warning: {counts['judgments_unknown_doc']} judgments name documents that are not in the corpus")
    lines.extend(notes)
    lines.append(f"next: tuner run {out / EXPERIMENT_FILE}")
    lines.append(f"  or, the fusion params replayed (one trial searches their grid): tuner run {out / REPLAY_FILE}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_data_tool(lambda: "\n".join(summary(*run(args))))


if __name__ == "__main__":
    sys.exit(main())
