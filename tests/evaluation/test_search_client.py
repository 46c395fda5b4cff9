"""SearchClient's HTTP behaviour on real sockets: the cases users knew from httpx
(redirects followed, compressed answers decoded before the byte cap, failures named
ConnectError / ReadTimeout) and the batch's search window."""

import asyncio
import gzip
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tuner.evaluation import EvalSpec, RequestMapping
from tuner.evaluation.batch import BatchTiming, run_batch
from tuner.evaluation.client import SearchClient
from tuner.evaluation.mapping import PreparedRequest

ANSWER = {"results": [{"doc_id": f"d{i}", "score": 1.0 - i / 100, "title": "fusion " * 20} for i in range(40)]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.seen.append((self.path, body, dict(self.headers)))
        if self.path == "/moved":  # 307 keeps the method and the body
            return self._send(307, b"", {"Location": "/search"})
        if self.path == "/loop":
            return self._send(302, b"", {"Location": "/loop"})
        if self.path == "/slow":
            time.sleep(1.0)
        data = json.dumps(ANSWER).encode()
        if self.path == "/gzip":
            return self._send(200, gzip.compress(data), {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        return self._send(200, data, {"Content-Type": "application/json"})

    do_GET = do_POST

    def _send(self, status, data, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.seen = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv, path):
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _send(url, **spec_kw):
    spec = EvalSpec(request=RequestMapping(url=url), **{"retries": 1, "backoff_s": 0.01, "backoff_max_s": 0.02,
                                                          **spec_kw})
    request = PreparedRequest("q1", "rid-1", "POST", url, {"X-Request-ID": "rid-1"}, json={"query": "rrf", "top_k": 10})

    async def go():
        async with SearchClient(spec) as client:
            return await client.send(request), client.window_s

    return asyncio.run(go())


def test_a_307_is_followed_with_its_body(server):
    exchange, _ = _send(_url(server, "/moved"))
    assert exchange.ok and json.loads(exchange.content) == ANSWER
    assert [p for p, _, _ in server.seen] == ["/moved", "/search"]
    assert server.seen[1][1] == {"query": "rrf", "top_k": 10}
    assert server.seen[1][2]["X-Request-ID"] == "rid-1"


def test_a_compressed_answer_is_decoded_and_capped_on_its_decoded_size(server):
    exchange, _ = _send(_url(server, "/gzip"))
    assert exchange.ok and json.loads(exchange.content) == ANSWER
    size = len(json.dumps(ANSWER).encode())
    assert len(gzip.compress(json.dumps(ANSWER).encode())) < 2048 < size  # under the cap on the wire, over it decoded
    capped, _ = _send(_url(server, "/gzip"), max_response_bytes=2048)
    assert not capped.ok and capped.error.startswith("ResponseTooLarge (not retried)")
    assert capped.attempts == 1


def test_a_redirect_loop_fails_the_query_without_retries(server):
    exchange, _ = _send(_url(server, "/loop"))
    assert not exchange.ok and exchange.attempts == 1
    assert exchange.error.startswith("TooManyRedirects (not retried)")


def test_nothing_listening_is_a_connect_error_after_every_attempt():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    exchange, window = _send(f"http://127.0.0.1:{port}/search", retries=2)
    assert not exchange.ok and exchange.attempts == 3
    assert exchange.error.startswith("ConnectError after 3 attempt(s):")
    assert window > 0  # the failed attempts are the window: it does not stay 0


def test_a_silent_backend_is_a_read_timeout_not_the_whole_request_deadline(server):
    exchange, _ = _send(_url(server, "/slow"), timeout_s=0.2, retries=0)
    assert not exchange.ok
    assert exchange.error == "ReadTimeout after 1 attempt(s): no data from the backend for 0.2 s (evaluation.timeout_s)"


def test_the_batch_window_is_the_search_calls_inside_the_batch_wall_time(server):
    from tuner.data.dataset import Query, QuerySet

    queries = QuerySet("w", "h", tuple(Query(f"q{i}", f"text {i}", "short", "faq", "in") for i in range(8)))
    spec = EvalSpec(request=RequestMapping(url=_url(server, "/search")), top_k=10, concurrency=2)
    timing = BatchTiming()
    started = time.perf_counter()
    result = run_batch(spec, queries, {"q0": {"d0": 3}}, timing=timing)
    wall = time.perf_counter() - started
    assert len(result.per_query) == 8 and len(server.seen) == 8
    assert 0 < timing.window_s <= wall
    assert 0 < timing.handling_s < timing.window_s + wall


def _raw_server(header_bytes: int):
    """Answers every connection with a 200 carrying an X-Debug header of that length."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                body = json.dumps(ANSWER).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Debug: " + b"a" * header_bytes
                             + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    threading.Thread(target=serve, daemon=True).start()
    return sock


def test_long_header_lines_are_read_and_an_absurd_one_is_a_protocol_error() -> None:
    from tuner.evaluation.client import MAX_HEADER_LINE

    for size, ok in ((20_000, True), (MAX_HEADER_LINE + 10, False)):  # aiohttp's own limit is 8190
        sock = _raw_server(size)
        try:
            exchange, _ = _send(f"http://127.0.0.1:{sock.getsockname()[1]}/search", retries=0)
        finally:
            sock.close()
        assert exchange.ok is ok, (size, exchange.error)
        if ok:
            assert json.loads(exchange.content) == ANSWER
        else:
            assert exchange.error.startswith("RemoteProtocolError (not retried): Got more than"), exchange.error


def test_http_proxy_from_the_environment_carries_the_request(server, monkeypatch) -> None:
    """HTTP_PROXY is honoured as httpx honours it: the answer comes through the proxy
    (here the test server, which sees the absolute URL) for a host nothing resolves."""
    monkeypatch.setenv("HTTP_PROXY", _url(server, ""))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    exchange, _ = _send("http://backend.invalid/search")
    assert exchange.ok, exchange.error
    assert [path for path, _, _ in server.seen] == ["http://backend.invalid/search"]


def test_no_proxy_sends_the_request_straight_to_the_backend(server, monkeypatch) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: a proxy that refuses every connection
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead.getsockname()[1]}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        exchange, _ = _send(_url(server, "/search"))
    finally:
        dead.close()
    assert exchange.ok, exchange.error
    assert [path for path, _, _ in server.seen] == ["/search"]


def test_a_netrc_login_is_sent_unless_the_request_has_its_own_authorization(server, monkeypatch, tmp_path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login tuner password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for var in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    exchange, _ = _send(_url(server, "/search"))
    assert exchange.ok, exchange.error
    assert server.seen[-1][2]["Authorization"] == "Basic dHVuZXI6czNjcmV0"  # tuner:s3cret

    spec = EvalSpec(request=RequestMapping(url=_url(server, "/search")), retries=0)
    own = PreparedRequest("q2", "rid-2", "POST", _url(server, "/search"),
                          {"X-Request-ID": "rid-2", "Authorization": "Bearer tok"}, json={"query": "q"})

    async def go():
        async with SearchClient(spec) as client:
            return await client.send(own)

    exchange = asyncio.run(go())
    assert exchange.ok, exchange.error
    assert server.seen[-1][2]["Authorization"] == "Bearer tok"
