"""One exception tree for the whole package.

Every error carries a message of one line that says what is wrong, where (file and
line, query id, config key) and how to fix it. Only the CLI turns these into output
and exit codes; library code raises, never prints or exits.
"""

from __future__ import annotations

from typing import Any


class TunerError(Exception):
    """Base of every error fusion-tuner raises on purpose."""

    exit_code = 2


class InputError(TunerError):
    """A user-supplied file or value is malformed (qrels, run, query set, YAML)."""


class ConfigError(TunerError):
    """An experiment, search-space or target config file is invalid."""


class LabelError(TunerError):
    """The label cache cannot serve or accept the requested labels."""


class EvaluationError(TunerError):
    """A batch evaluation could not produce a trustworthy result."""


class FailureBudgetExceeded(EvaluationError):
    """Too many queries of one batch failed."""

    #: the batch's failed queries (tuner.evaluation.outcomes.FailedQuery), set by the batch
    failed: list[Any]


class ResponseMappingError(EvaluationError):
    """A search response does not match the declared response mapping."""


class TargetError(TunerError):
    """The backend could not be started, restarted or stopped."""


class HealthTimeout(TargetError):
    """The backend did not become healthy before its deadline."""


class BackendExited(TargetError):
    """The backend process or container exited while we waited for it."""


class StudyError(TunerError):
    """The study cannot continue (failure budget exceeded, storage refused, ...)."""


class DatabaseUnreachable(StudyError):
    """The study's database stopped answering for longer than the tuner waits out."""


class DiskFull(TunerError):
    """A write failed because the filesystem holding it is full (tuner.diskspace)."""
