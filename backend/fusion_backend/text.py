"""The one analyzer shared by BM25 and LSA, so both see the same terms.

Lower-cased word tokens of two or more characters (the scikit-learn default pattern),
minus a short English stopword list. Changing it changes ``ANALYZER_VERSION``, which
is part of every index cache key.
"""

from __future__ import annotations

import re

ANALYZER_VERSION = "word2-stop1"

_TOKEN = re.compile(r"(?u)\b\w\w+\b")

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves
    """.split()
)


def analyze(text: str) -> list[str]:
    """Tokens of ``text`` in order (duplicates kept: term frequency matters)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]
