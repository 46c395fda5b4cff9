"""The deterministic demo data set: a product catalog, shopper queries, graded labels.

``python -m fusion_backend.datagen demo --out DIR [--seed N]`` writes corpus.jsonl,
queries.jsonl, qrels.txt and manifest.json (see docs/data.md).
"""

from .demo import DEFAULT_SEED, generate_demo, write_demo

__all__ = ["DEFAULT_SEED", "generate_demo", "write_demo"]
