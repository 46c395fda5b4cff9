"""``python -m fusion_backend.datagen demo --out DIR [--seed N]``.

One summary line on success, one ``error:`` line and exit code 2 when the bundle
cannot be written (printed by ``fusion_backend.cli.run_data_tool``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import run_data_tool
from ..importers.dataset import Dataset
from .demo import DEFAULT_SEED, write_demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fusion_backend.datagen", description="Generate the deterministic demo data set."
    )
    sub = parser.add_subparsers(dest="dataset", required=True)
    demo = sub.add_parser("demo", help="product catalog + shopper queries + graded labels")
    demo.add_argument("--out", type=Path, required=True, help="output directory (created; files replaced atomically)")
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_data_tool(lambda: summary(write_demo(args.out, args.seed), args.seed, args.out))


def summary(dataset: Dataset, seed: int, out: Path) -> str:
    counts = dataset.counts()
    return (
        f"demo (seed {seed}): {counts['documents']} listings, {counts['queries_in_scope']} in-scope and "
        f"{counts['queries_oos']} out-of-scope queries, {counts['judgments']} judgments -> {out}"
    )


if __name__ == "__main__":
    sys.exit(main())
