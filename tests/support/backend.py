"""Start the reference backend (``python -m fusion_backend serve``) as a real process.

Every test that needs a live search service uses this::

    from support.backend import start_backend, write_backend_config

    cfg = write_backend_config(tmp_path / "config.yaml", corpus=corpus_path,
                               overrides={"fusion": {"method": "linear"}})
    with start_backend(cfg) as backend:
        httpx.post(f"{backend.url}/search", json={"query": "sofa", "top_k": 10})

``start_backend`` picks a free loopback port (unless given one), waits for
``GET /health`` to answer 200, and on exit sends SIGTERM (then SIGKILL). When the
process dies or never gets healthy it raises ``BackendStartError`` whose message holds
the exit code and the tail of the process's stderr.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuner.config.experiment import free_port

HOST = "127.0.0.1"
BACKEND_DIR = Path(__file__).resolve().parents[2] / "backend"
DEFAULT_CONFIG = BACKEND_DIR / "config.yaml"
_PORT_RETRIES = 3  # a picked port can be taken by another test before the backend binds it


class BackendStartError(RuntimeError):
    """The backend exited or did not become healthy in time (message includes stderr)."""


@dataclass
class RunningBackend:
    process: subprocess.Popen[bytes]
    port: int
    config_path: Path
    stderr_path: Path
    host: str = HOST
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def health(self, timeout: float = 2.0) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=timeout)

    def search(self, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None,
               timeout: float = 10.0) -> httpx.Response:
        return httpx.post(f"{self.url}/search", json=dict(body), headers=dict(headers or {}), timeout=timeout)

    def wait_healthy(self, timeout: float = 60.0) -> dict[str, Any]:
        """Poll /health until 200; raise BackendStartError when the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendStartError(self._failure(f"exited with code {self.process.returncode}"))
            try:
                response = self.health(timeout=1.0)
                if response.status_code == 200:
                    return response.json()
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = type(exc).__name__
            time.sleep(0.05)
        raise BackendStartError(self._failure(f"not healthy after {timeout:.0f} s (last: {last})"))

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stopped = True
        return self.process.returncode

    def _failure(self, what: str) -> str:
        tail = "\n".join(self.stderr().strip().splitlines()[-20:]) or "(stderr empty)"
        return f"backend {self.config_path} on port {self.port} {what}; stderr:\n{tail}"


def launch_backend(config_path: Path, *, port: int | None = None, host: str = HOST,
                   extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> RunningBackend:
    """Start the process and return at once (no health wait): for tests of the 503 phase."""
    port = free_port(host) if port is None else port
    fd, stderr_name = tempfile.mkstemp(prefix="fusion-backend-", suffix=".stderr")
    cmd = [sys.executable, "-m", "fusion_backend", "serve", "--config", str(config_path),
           "--host", host, "--port", str(port), *extra_args]
    with os.fdopen(fd, "wb") as stderr:
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})})
    return RunningBackend(process, port, Path(config_path), Path(stderr_name), host)


@contextlib.contextmanager
def start_backend(config_path: Path, *, port: int | None = None, timeout: float = 60.0, host: str = HOST,
                  extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Iterator[RunningBackend]:
    """Run the backend until the block exits; yields once /health is 200."""
    attempts = 1 if port is not None else _PORT_RETRIES
    for attempt in range(attempts):
        backend = launch_backend(config_path, port=port, host=host, extra_args=extra_args, env=env)
        try:
            backend.wait_healthy(timeout)
            break
        except BackendStartError:
            backend.stop()
            taken = "address already in use" in backend.stderr().lower()
            _remove(backend.stderr_path)
            if not (taken and attempt + 1 < attempts):
                raise
    try:
        yield backend
    finally:
        backend.stop()
        _remove(backend.stderr_path)


def write_backend_config(path: Path, *, corpus: Path, index_cache: Path | None = None,
                         overrides: Mapping[str, Any] | None = None, base: Path = DEFAULT_CONFIG) -> Path:
    """Copy ``base`` (comments kept) with data.corpus, data.index_cache and deep-merged overrides.

    The index cache defaults to ``<path's dir>/index-cache``; pass the same directory to
    several configs to share built indexes between them.
    """
    from ruamel.yaml import YAML

    yaml = YAML()
    doc = yaml.load(Path(base).read_text())
    doc["data"]["corpus"] = str(corpus)
    doc["data"]["index_cache"] = str(index_cache or Path(path).parent / "index-cache")
    _merge(doc, copy.deepcopy(dict(overrides or {})))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as fh:
        yaml.dump(doc, fh)
    return Path(path)


def _merge(target: Any, overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), Mapping) and value:
            _merge(target[key], value)
        else:
            target[key] = value


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
