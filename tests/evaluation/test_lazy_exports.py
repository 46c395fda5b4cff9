"""tuner.evaluation hands out its names lazily (module __getattr__); its literal __all__
(what ruff and mypy read) must list exactly the names it can hand out, and each must resolve."""

from __future__ import annotations

import tuner.evaluation as evaluation


def test_all_lists_every_lazy_name_and_each_resolves() -> None:
    assert evaluation.__all__ == sorted(evaluation._MODULE_OF)
    for name in evaluation.__all__:
        assert getattr(evaluation, name) is not None
