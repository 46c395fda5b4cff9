"""``python -m fusion_backend.datagen demo --out DIR [--seed N]``.

The only place in the generator that prints or exits: one summary line on success,
one ``error:`` line and exit code 2 when the bundle cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..importers.errors import DataFormatError
from .demo import DEFAULT_SEED, write_demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fusion_backend.datagen",
                                     description="Generate the deterministic demo data set.")
    sub = parser.add_subparsers(dest="dataset", required=True)
    demo = sub.add_parser("demo", help="product catalog + shopper queries + graded labels")
    demo.add_argument("--out", type=Path, required=True, help="output directory (created; files replaced atomically)")
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        dataset = write_demo(args.out, args.seed)
    except DataFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = dataset.counts()
    print(f"demo (seed {args.seed}): {counts['documents']} listings, {counts['queries_in_scope']} in-scope and "
          f"{counts['queries_oos']} out-of-scope queries, {counts['judgments']} judgments -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
