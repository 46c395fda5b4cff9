"""The marker sent to a helper process in place of something it already holds: a
study's labels and queries (tuner.report.report_worker), a replay context
(tuner.study.replay.replay_pool).

An enum member unpickles to itself, so the marker is compared by identity and no value
sent can be taken for it. It lives here, not in the helpers' own modules: a helper runs
its module as ``__main__``, whose copy of a class defined there is not the one the
caller's pickle names."""

from __future__ import annotations

import enum


class Held(enum.Enum):
    HELD = "held by the helper"


#: the one marker both helpers use
HELD = Held.HELD
