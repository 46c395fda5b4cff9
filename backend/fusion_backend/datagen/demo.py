"""The demo bundle: catalog + queries + complete rule-based labels, from one seed.

The qrels list every (query, listing) pair with grade >= 1, plus grade 0 for every
other listing that shares a distinctive word with the query (one found in at most
``DISTINCTIVE_DF`` of the listings: what BM25 would plausibly rank), so judged-hit
coverage is meaningful. The labels are complete on the catalog either way: an
unlisted pair is Irrelevant by rule.
The manifest records each query's intent, so any grade can be re-derived from it and
the listing's attributes in corpus.jsonl.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..importers.dataset import Dataset, Document, Judgment, Query, write_dataset
from ..text import analyze
from .catalog import DAYS_AFTER_LAST_DROP, DROP_EVERY_DAYS, NOW, Product, generate_products
from .draw import Draw
from .labels import grade
from .listing import render
from .queries import DemoQuery, in_scope_queries, out_of_scope_queries
from .vocabulary import FAMILY, VOCABULARY_VERSION

DEFAULT_SEED = 7
SOURCE = "demo"
DISTINCTIVE_DF = 0.05

LABEL_RULES = {
    "3": "right type and every stated attribute (temporal: listed within date_hint_days of now)",
    "2": "right type with exactly one stated attribute off, or listed just outside the window (<= 2x the hint)",
    "1": "same family only (seating, lamps, shoes, ...): right type with two or more misses, or another type",
    "0": "anything else; listed as 0 when the listing shares a distinctive word with the query, else absent "
    "(same meaning)",
}


def _document(product: Product, draw: Draw) -> Document:
    title, text = render(product, draw)
    attributes = {
        "product_type": product.type,
        "family": FAMILY[product.type],
        "category": product.category,
        "colour": product.colour,
        "material": product.material,
        "style": product.style,
        "feature": product.feature,
        "brand": product.brand,
        "model": product.model,
        "ref": product.ref,
    }
    return Document(product.doc_id, title, text, product.date.isoformat(), attributes)


def _judgments(
    query_id: str, query: DemoQuery, products: list[Product], doc_tokens: list[set[str]], distinctive: set[str]
) -> list[Judgment]:
    if query.intent is None:
        return []
    words = set(analyze(query.text)) & distinctive
    out = []
    for product, tokens in zip(products, doc_tokens, strict=True):
        g = grade(query.intent, product, NOW)
        if g > 0 or words & tokens:
            out.append(Judgment(query_id, product.doc_id, g))
    return out


def _distinctive(doc_tokens: list[set[str]]) -> set[str]:
    df = Counter(t for tokens in doc_tokens for t in tokens)
    return {t for t, n in df.items() if n <= DISTINCTIVE_DF * len(doc_tokens)}


def generate_demo(seed: int = DEFAULT_SEED) -> Dataset:
    """The whole demo data set for ``seed`` (pure: no I/O)."""
    draw = Draw(seed)
    products = generate_products(draw)
    documents = [_document(p, draw) for p in products]
    demo_queries = in_scope_queries(products, draw) + out_of_scope_queries(products, draw)
    doc_tokens = [set(analyze(f"{d.title}\n{d.text}")) for d in documents]
    distinctive = _distinctive(doc_tokens)
    queries, judgments, intents = [], [], {}
    for number, q in enumerate(demo_queries, start=1):
        query_id = f"q{number:03d}"
        queries.append(Query(query_id, q.text, q.query_type, SOURCE, scope=q.scope, extra=q.extra))
        judgments += _judgments(query_id, q, products, doc_tokens, distinctive)
        if q.intent is not None:
            intents[query_id] = q.intent.to_record()
    manifest = {
        "seed": seed,
        "generator": "fusion_backend.datagen demo",
        "vocabulary_version": VOCABULARY_VERSION,
        "now": NOW.isoformat(),
        "listing_drops": {
            "every_days": DROP_EVERY_DAYS,
            "last": max(p.date for p in products).isoformat(),
            "days_after_last_drop": DAYS_AFTER_LAST_DROP,
        },
        "grade_rules": LABEL_RULES,
        "distinctive_word_max_df": DISTINCTIVE_DF,
        "intents": intents,
    }
    return Dataset("demo", documents, queries, judgments, manifest)


def write_demo(out_dir: Path, seed: int = DEFAULT_SEED) -> Dataset:
    """Generate and write the bundle into ``out_dir`` (files replaced atomically)."""
    dataset = generate_demo(seed)
    write_dataset(dataset, out_dir)
    return dataset
