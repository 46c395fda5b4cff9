"""``python -m fusion_backend.importers cranfield|cacm|trec|beir ... --out DIR``.

The only place in the importers that prints or exits: one summary line on success,
one ``error:`` line (file:line, problem, fix) and exit code 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import cacm, cranfield, trec
from .beir import import_beir
from .cacm import import_cacm
from .cranfield import import_cranfield
from .dataset import Dataset, write_dataset
from .errors import DataFormatError
from .grades import GradeMap, parse_grade_map
from .trec import import_trec


def _grade_map(spec: str | None) -> GradeMap | None:
    return parse_grade_map(spec) if spec else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fusion_backend.importers",
        description="Import a test collection as corpus.jsonl + queries.jsonl + qrels.txt (+ manifest.json).")
    sub = parser.add_subparsers(dest="collection", required=True)

    def command(name: str, help_text: str, short_default: int) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--out", type=Path, required=True, help="output directory (created; files replaced atomically)")
        p.add_argument("--short-max-words", type=int, default=short_default,
                       help=f"queries with at most this many words are 'short', longer ones 'long_tail' "
                            f"(default {short_default})")
        return p

    p = command("cranfield", "Cranfield 1400 (cran.all.1400, cran.qry, cranqrel)", cranfield.SHORT_MAX_WORDS)
    p.add_argument("--src", type=Path, required=True, help="directory holding the Cranfield files")
    p.add_argument("--grade-map", help="Cleverdon code -> grade, default \"1:3,2:2,3:1,4:1,-1:0\"")
    p.add_argument("--oos-from-cacm", type=int, default=0, metavar="N",
                   help="append the first N CACM queries as out-of-scope (scope oos) queries")
    p.add_argument("--cacm-src", type=Path, help="CACM directory for --oos-from-cacm (default: SRC/../cacm)")

    p = command("cacm", "CACM (cacm.all, query.text, qrels.text)", cacm.SHORT_MAX_WORDS)
    p.add_argument("--src", type=Path, required=True, help="directory holding the CACM files")
    p.add_argument("--relevant-grade", type=int, default=3, help="grade of a judged-relevant document (default 3)")

    p = command("trec", "TREC topics + qrels (+ SGML documents, run files)", trec.SHORT_MAX_WORDS)
    p.add_argument("--topics", type=Path, required=True, help="topics file (<top> SGML, or qid<TAB>text)")
    p.add_argument("--qrels", type=Path, required=True, help="qrels file 'qid iter docno rel'")
    p.add_argument("--docs", type=Path, nargs="*", default=[], help="TREC SGML document files (.gz allowed)")
    p.add_argument("--run", action="append", default=[], metavar="NAME=PATH",
                   help="run file to convert into OUT/runs/NAME.run (repeatable)")
    p.add_argument("--query-field", choices=["title", "desc", "title+desc"], default="title")
    p.add_argument("--grade-map", help="relevance code -> grade, e.g. \"2:3,1:2,0:0\" (default: auto)")
    p.add_argument("--source", default="trec", help="value of the queries' 'source' field")

    p = command("beir", "BEIR layout (corpus.jsonl, queries.jsonl, qrels/*.tsv)", 6)
    p.add_argument("--src", type=Path, required=True, help="BEIR dataset directory")
    p.add_argument("--splits", help="comma-separated qrels splits to import (default: all)")
    p.add_argument("--grade-map", help="qrels score -> grade, e.g. \"2:3,1:1,0:0\" (default: auto)")
    return parser


def run(args: argparse.Namespace) -> tuple[Dataset, Path]:
    extra: dict[str, str] = {}
    if args.collection == "cranfield":
        dataset = import_cranfield(args.src, grade_map=_grade_map(args.grade_map), short_max_words=args.short_max_words,
                                   oos_from_cacm=args.oos_from_cacm, cacm_src=args.cacm_src)
    elif args.collection == "cacm":
        dataset = import_cacm(args.src, relevant_grade=args.relevant_grade, short_max_words=args.short_max_words)
    elif args.collection == "trec":
        dataset, extra = import_trec(args.topics, args.qrels, docs=args.docs, runs=args.run,
                                     query_field=args.query_field, grade_map=_grade_map(args.grade_map),
                                     short_max_words=args.short_max_words, source=args.source)
    else:
        splits = [s.strip() for s in args.splits.split(",")] if args.splits else None
        dataset = import_beir(args.src, splits=splits, grade_map=_grade_map(args.grade_map),
                              short_max_words=args.short_max_words)
    write_dataset(dataset, args.out, extra)
    return dataset, args.out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        dataset, out = run(args)
    except DataFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = dataset.counts()
    print(f"{dataset.name}: {counts['documents']} documents, {counts['queries']} queries "
          f"({counts['queries_oos']} out of scope), {counts['judgments']} judgments -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
