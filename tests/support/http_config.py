"""Experiments on the HTTP config channel (``target.channel: http``) against a reference
backend the test starts itself (the engine runs elsewhere: ``target.apply: none``), so
it outlives a killed tuner and what it serves can be compared before and after.

    with external_backend(root / "backend-config" / "config.yaml", data) as backend: ...
    http_overrides(backend.url) -> experiment overrides (reference_experiment's shape)
    served_document(backend.url) -> bytes   # GET /admin/config's body, as served
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from support.backend import RunningBackend, start_backend
from support.reference_experiment import DROP


@contextlib.contextmanager
def external_backend(config: Path, *, env: Mapping[str, str] | None = None) -> Iterator[RunningBackend]:
    """The reference backend serving ``config`` with a config store beside it: an
    accepted PUT /admin/config is what it serves, across restarts too."""
    with start_backend(config, timeout=120, extra_args=["--config-store", str(config.with_name("store.json"))],
                       env=env) as backend:
        yield backend


def http_overrides(base_url: str, **http: Any) -> dict[str, Any]:
    """The experiment's target and request for the backend at ``base_url``."""
    return {
        "target": {"channel": "http", "config_files": DROP, "apply": "none", "port": DROP, "process": DROP,
                   "http": {"url": f"{base_url}/admin/config", **http},
                   "health": {"url": f"{base_url}/health"}},
        "evaluation": {"request": {"url": f"{base_url}/search"}},
    }


def served_document(base_url: str) -> bytes:
    answer = httpx.get(f"{base_url}/admin/config", timeout=30)
    answer.raise_for_status()
    return answer.content
