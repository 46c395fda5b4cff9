"""wait_healthy against real loopback servers and a real dying process."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.config.experiment import free_port
from tuner.config.target import ProcessConfig
from tuner.errors import BackendExited, HealthTimeout
from tuner.targets.health import wait_healthy
from tuner.targets.process import ProcessTarget


class Scripted(http.server.ThreadingHTTPServer):
    """Answers /health with 503 for the first ``unhealthy`` requests, then 200."""

    def __init__(self, unhealthy: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.unhealthy = unhealthy
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/health"


def answer_json(handler: http.server.BaseHTTPRequestHandler, status: int, doc: object) -> None:
    body = json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            n = self.server.requests
        ok = n > self.server.unhealthy
        answer_json(self, 200 if ok else 503, {"status": "ok" if ok else "loading", "n": n})

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def serve() -> Iterator[callable]:
    servers: list[Scripted] = []

    def start(unhealthy: int) -> Scripted:
        server = Scripted(unhealthy)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_retries_503_until_healthy_and_returns_the_body(serve) -> None:
    server = serve(unhealthy=3)
    body = wait_healthy(server.url, deadline_s=20, interval_s=0.01, max_interval_s=0.05)
    assert body == {"status": "ok", "n": 4}
    assert server.requests == 4


def test_never_healthy_times_out_naming_url_deadline_and_last_status(serve) -> None:
    server = serve(unhealthy=10**9)
    started = time.monotonic()
    with pytest.raises(HealthTimeout) as exc:
        wait_healthy(server.url, deadline_s=0.8, interval_s=0.05, max_interval_s=0.2)
    took = time.monotonic() - started
    message = str(exc.value)
    assert server.url in message and "deadline_s=0.8" in message
    assert "last seen: HTTP 503" in message and '"loading"' in message
    # the last attempt happens at the deadline, not long after (generous: a busy 2-core machine under xdist)
    assert 0.8 <= took < 0.8 + 10.0
    assert server.requests >= 3


def test_connection_refused_is_retried_then_reported() -> None:
    url = f"http://127.0.0.1:{free_port()}/health"
    with pytest.raises(HealthTimeout, match=r"last seen: ConnectError"):
        wait_healthy(url, deadline_s=0.5, interval_s=0.05)


def test_a_dead_target_raises_backend_exited_at_once(tmp_path: Path) -> None:
    cfg = ProcessConfig(command=["{python}", "-c", "import sys; print('cannot load index'); sys.exit(3)"])
    target = ProcessTarget(cfg, config_files=[tmp_path / "c.yaml"], state_dir=tmp_path)
    target.start()
    url = f"http://127.0.0.1:{free_port()}/health"
    started = time.monotonic()
    with pytest.raises(BackendExited) as exc:
        wait_healthy(url, deadline_s=60, target=target, interval_s=0.5, max_interval_s=2)
    assert time.monotonic() - started < 30  # far below the 60 s deadline (generous: a busy machine)
    assert "exited with code 3: cannot load index" in str(exc.value)
    assert url in str(exc.value)
    target.stop()


def test_a_target_that_dies_between_attempts_is_noticed_within_the_backoff(tmp_path: Path, serve) -> None:
    server = serve(unhealthy=10**9)
    cfg = ProcessConfig(command=["{python}", "-c", "import time, sys; time.sleep(0.7); sys.exit(4)"])
    target = ProcessTarget(cfg, config_files=[tmp_path / "c.yaml"], state_dir=tmp_path)
    target.start()
    started = time.monotonic()
    with pytest.raises(BackendExited, match="exited with code 4"):
        # A 5 s backoff step: the death must still be seen within a poll slice.
        wait_healthy(server.url, deadline_s=60, target=target, interval_s=5, max_interval_s=5)
    assert time.monotonic() - started < 3
    target.stop()


def test_non_json_200_returns_an_empty_dict(tmp_path: Path) -> None:
    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert wait_healthy(f"http://127.0.0.1:{server.server_address[1]}/", deadline_s=5) == {}
    finally:
        server.shutdown()
        server.server_close()



def test_the_fingerprint_field_of_a_health_answer(serve) -> None:
    from tuner.errors import TargetError
    from tuner.targets.health import health_fingerprint

    server = serve(unhealthy=1)
    body = wait_healthy(server.url, deadline_s=20, interval_s=0.01)
    assert health_fingerprint(body, "n") == "2"  # not a string: its JSON
    nested = {"status": "ok", "index": {"sha": "ab12", "parts": {"b": 1, "a": 2}}}
    assert health_fingerprint(nested, "index.sha") == "ab12"
    assert health_fingerprint(nested, "index.parts") == '{"a": 2, "b": 1}'
    with pytest.raises(TargetError) as exc:
        health_fingerprint(nested, "index.digest")
    assert str(exc.value) == (
        "target.health.fingerprint 'index.digest': the health answer has no 'digest' in index"
        " (keys: parts, sha); name a field the backend reports, or remove target.health.fingerprint")
    with pytest.raises(TargetError, match="has no 'data_fingerprint' in the body"):
        health_fingerprint({}, "data_fingerprint")
    with pytest.raises(TargetError, match="is empty"):
        health_fingerprint({"data_fingerprint": None}, "data_fingerprint")


def test_health_waits_share_one_tls_context(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    # an httpx client built without verify= loads the CA bundle again (tuner/tls.py): a study
    # paid that on every trial's health wait
    import ssl

    from tuner.tls import shared_ssl_context

    built: list[object] = []  # CA bundles loaded: what httpx does for a client without a context
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        built.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    shared_ssl_context.cache_clear()
    try:
        for _ in range(3):
            server = serve(unhealthy=0)
            assert wait_healthy(server.url, deadline_s=20)["status"] == "ok"
    finally:
        shared_ssl_context.cache_clear()
    assert len(built) == 1


class _KeyedHandler(http.server.BaseHTTPRequestHandler):
    """Health only with a key, as Azure AI Search (api-key) or a secured Elasticsearch
    answers it: 401 without the header, 200 with it."""

    key = "health-key-0123456789"

    def do_GET(self) -> None:
        ok = self.headers.get("api-key") == self.key
        answer_json(self, 200 if ok else 401, {"status": "ok"} if ok else {"error": "missing or wrong api-key"})

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def keyed() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def test_health_headers_are_sent_so_a_keyed_engine_is_healthy(keyed: str) -> None:
    from tuner.config.target import HealthConfig
    from tuner.targets.health import wait_target_healthy

    # 5 s, not less: with 0.5 s a loaded machine (the fast tier beside other work) saw the
    # deadline pass before the first 401 came back, so "last seen" had nothing to name
    with pytest.raises(HealthTimeout, match="last seen: HTTP 401") as exc:
        wait_target_healthy(HealthConfig(url=keyed, deadline_s=5, interval_s=0.05), None)
    assert _KeyedHandler.key not in str(exc.value)
    health = HealthConfig(url=keyed, headers={"api-key": _KeyedHandler.key}, deadline_s=20, interval_s=0.05)
    assert wait_target_healthy(health, None) == {"status": "ok"}


def test_health_headers_are_expanded_and_every_value_is_a_secret(tmp_path: Path, monkeypatch, keyed: str) -> None:
    # ${ENV} as evaluation.request headers; the value is scrubbed from any text even under a
    # header name that says nothing of a secret
    from tests.support.reference_experiment import write_reference_experiment
    from tuner import secrets
    from tuner.config.experiment import load_experiment
    from tuner.targets.health import wait_target_healthy

    monkeypatch.setenv("HEALTH_KEY", _KeyedHandler.key)
    monkeypatch.setenv("TENANT", "tenant-name-0042")
    path = write_reference_experiment(
        tmp_path, study="s", n_trials=1,
        target={"health": {"url": keyed, "headers": {"api-key": "${HEALTH_KEY}", "X-Tenant": "${TENANT}"}}},
    )
    secrets.forget_all()
    try:
        exp = load_experiment(path, check_paths=False)
        assert exp.target.health.headers == {"api-key": _KeyedHandler.key, "X-Tenant": "tenant-name-0042"}
        assert wait_target_healthy(exp.target.health, None) == {"status": "ok"}
        shown = secrets.redact_text(f"GET {keyed} with api-key {_KeyedHandler.key} for tenant-name-0042")
        assert _KeyedHandler.key not in shown and "tenant-name-0042" not in shown
    finally:
        secrets.forget_all()


def test_reload_http_headers_are_sent_with_the_reload_call(keyed: str, tmp_path: Path) -> None:
    # the reload endpoint of a secured engine takes the same key (target.reload.http.headers)
    from tuner.config.target import HealthConfig, ReloadConfig
    from tuner.targets.reload import ConfigApplier

    class Up:
        def failure(self) -> str | None:
            return None

    def applier(headers: dict[str, str]) -> ConfigApplier:
        reload = ReloadConfig(http={"url": keyed, "method": "GET", "headers": headers}, fingerprint="sha")
        return ConfigApplier(Up(), dict, reload, HealthConfig(url=keyed), [tmp_path / "c.yaml"])  # type: ignore[arg-type]

    refused = applier({})._request()
    assert refused is not None and refused.startswith("HTTP 401 from GET")
    assert applier({"api-key": _KeyedHandler.key})._request() is None  # acknowledged
