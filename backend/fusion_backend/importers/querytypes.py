"""Query types for imported collections, which carry no type of their own.

Imported queries are typed by length so per-type breakdowns still say something:
``short`` (at most ``short_max_words`` words) or ``long_tail``.
"""

from __future__ import annotations


def length_type(text: str, short_max_words: int) -> str:
    return "short" if len(text.split()) <= short_max_words else "long_tail"
