"""Seeded random choices that give the same sequence on every Python version.

Only ``random.Random.random()`` is used (its Mersenne Twister output is fixed across
versions); ``choice``/``sample``/``shuffle`` have changed their algorithms between
releases, so they are rebuilt here on top of it. One ``Draw`` is consumed in a fixed
order by the whole generator, so a seed always yields the same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Draw:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def uniform(self) -> float:
        """A float in [0, 1)."""
        return self._rng.random()

    def index(self, n: int) -> int:
        """An int in [0, n)."""
        return min(int(self._rng.random() * n), n - 1)

    def pick(self, items: Sequence[T]) -> T:
        return items[self.index(len(items))]

    def weighted(self, weights: Sequence[float]) -> int:
        """An index drawn with probability proportional to ``weights``."""
        u, acc = self._rng.random() * sum(weights), 0.0
        for i, w in enumerate(weights):
            acc += w
            if u < acc:
                return i
        return len(weights) - 1

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items (all of them when there are fewer)."""
        pool, out = list(items), []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(self.index(len(pool))))
        return out

    def chance(self, p: float) -> bool:
        return self._rng.random() < p
