"""The backend's own exception tree (it never imports the tuner package).

Messages are one line: what is wrong, where (file:line, key, query id) and how to fix
it. Only ``fusion_backend.cli`` turns them into stderr output and exit codes.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error the backend raises on purpose."""

    exit_code = 1


class ConfigError(BackendError):
    """The config file is invalid; the service refuses to start (before binding)."""

    exit_code = 2


class CorpusError(BackendError):
    """The corpus or a run file cannot be read; the service exits while loading."""


class IndexBuildError(BackendError):
    """The on-disk index cache could not be built or read."""


class LoadError(BackendError):
    """The index load failed after the port was bound; the server stopped."""
