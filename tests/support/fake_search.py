"""A small but real HTTP search service for tests, on loopback port 0.

It serves deterministic responses from a dict keyed by query text, over real
sockets (stdlib ThreadingHTTPServer, HTTP/1.1 keep-alive), and records every request
it receives. Switches inject the failures batch evaluation must survive or report:
5xx for the first N attempts or forever, connection resets, non-JSON bodies, slow
responses and arbitrary status codes; and hostile answers: a body dripped a few bytes
a second, far more hits than top_k asked for, a body streamed without end.

    with FakeSearch({"what is rrf": {"results": [...], "handoff": False}}) as svc:
        svc.fail_times["what is rrf"] = 2          # two 500s, then the answer
        run_batch(EvalSpec(request=RequestMapping(url=svc.url)), ...)
        svc.requests                               # [Recorded(...), ...]
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    params: dict[str, str]

    @property
    def query(self) -> str | None:
        if self.body is not None:
            return self.body.get("query")
        return self.params.get("query")


@dataclass
class FakeSearch:
    """The service. ``responses[query_text]`` is the JSON payload to return (a list is
    wrapped as ``{"results": list}``); unknown queries get ``default``."""

    responses: dict[str, Any] = field(default_factory=dict)
    default: Any = field(default_factory=lambda: {"results": []})
    path: str = "/search"
    #: query -> number of 500 responses before the real answer
    fail_times: dict[str, int] = field(default_factory=dict)
    #: queries that always get a 500
    fail_always: set[str] = field(default_factory=set)
    #: query -> number of connection resets (RST, no response) before the real answer
    reset_times: dict[str, int] = field(default_factory=dict)
    #: queries answered with a 200 whose body is not JSON
    bad_json: set[str] = field(default_factory=set)
    #: query -> fixed status code to return (e.g. 404)
    status_for: dict[str, int] = field(default_factory=dict)
    #: query -> seconds to wait before answering (every attempt); "*" applies to all
    delay_s: dict[str, float] = field(default_factory=dict)
    #: query -> bytes per second: the headers (with Content-Length) at once, then the
    #: answer's body dripped at this rate (every attempt); "*" applies to all
    drip_bps: dict[str, float] = field(default_factory=dict)
    #: query -> junk hits appended after the answer's own (a backend ignoring top_k)
    extra_hits: dict[str, int] = field(default_factory=dict)
    #: query -> bytes of a 200 JSON body streamed chunked, no Content-Length, as fast as
    #: the client reads (a runaway body)
    flood_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.requests: list[Recorded] = []
        self.attempts: Counter[str] = Counter()
        #: query -> body bytes written for its last dripped or flooded answer before it
        #: ended or the client hung up
        self.body_bytes_sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FakeSearch:
        handler = _make_handler(self)
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-search", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeSearch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the service first"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base_url + self.path

    # -- behaviour (called from handler threads)

    def _record(self, rec: Recorded) -> int:
        with self._lock:
            self.requests.append(rec)
            key = rec.query or ""
            self.attempts[key] += 1
            return self.attempts[key]

    def _decide(self, query: str, attempt: int) -> tuple[str, Any]:
        with self._lock:
            delay = self.delay_s.get(query, self.delay_s.get("*", 0.0))
            if query in self.status_for:
                return "status", (self.status_for[query], delay)
            if attempt <= self.reset_times.get(query, 0):
                return "reset", delay
            if query in self.fail_always or attempt <= self.reset_times.get(query, 0) + self.fail_times.get(query, 0):
                return "status", (500, delay)
            if query in self.bad_json:
                return "bad_json", delay
            if query in self.flood_bytes:
                return "flood", (self.flood_bytes[query], delay)
            payload = self.responses.get(query, self.default)
            extra = self.extra_hits.get(query, 0)
            drip = self.drip_bps.get(query, self.drip_bps.get("*"))
        if isinstance(payload, list):
            payload = {"results": payload}
        if extra:
            payload = pad_results(payload, extra)
        if drip:
            return "drip", (payload, delay, drip)
        return "ok", (payload, delay)

    def _sent(self, query: str, n_bytes: int) -> None:
        with self._lock:
            self.body_bytes_sent[query] = n_bytes


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops SYNs when a batch opens 8+ connections at
    # once, and the kernel retries them a second later
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # resets and client timeouts are injected on purpose; keep test output clean
        pass


def _make_handler(svc: FakeSearch) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes; without this, Nagle + delayed ACK
            # add ~40 ms to every keep-alive response
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/health":
                self._send(200, b'{"status": "ok"}')
                return
            params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            self._serve(Recorded("GET", parts.path, dict(self.headers.items()), None, params))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                self._send(400, b'{"detail": "request body is not JSON"}')
                return
            self._serve(Recorded("POST", urlsplit(self.path).path, dict(self.headers.items()), body, {}))

        def _serve(self, rec: Recorded) -> None:
            if rec.path != svc.path:
                self._send(404, b'{"detail": "not found"}')
                return
            attempt = svc._record(rec)
            action, arg = svc._decide(rec.query or "", attempt)
            delay = arg[1] if isinstance(arg, tuple) else arg
            if delay:
                time.sleep(delay)
            if action == "reset":
                self._reset()
            elif action == "status":
                self._send(arg[0], json.dumps({"detail": f"injected {arg[0]}"}).encode())
            elif action == "bad_json":
                self._send(200, b"<html>502 Bad Gateway from a proxy</html>", "text/html")
            elif action == "drip":
                body = json.dumps(arg[0]).encode()
                self._headers(200, {"Content-Length": str(len(body))})
                svc._sent(rec.query or "", drip(self.wfile, body, arg[2]))
            elif action == "flood":
                self._headers(200, {"Transfer-Encoding": "chunked"})
                svc._sent(rec.query or "", flood(self.wfile, arg[0]))
                self.close_connection = True
            else:
                self._send(200, json.dumps(arg[0]).encode())

        def _headers(self, status: int, extra: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _reset(self) -> None:
            # SO_LINGER 0 makes close() send RST: the client sees a reset, not a clean EOF
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

    return Handler


# ----------------------------------------------------------------- hostile answers
# Shared with the fault suite's hostile process backend (tests/faults/test_hostile_responses.py).


def pad_results(payload: dict[str, Any], n: int, results_key: str = "results") -> dict[str, Any]:
    """``payload`` with ``n`` junk hits appended to its results (``pad-<j>``, score 0)."""
    padded = dict(payload)
    padded[results_key] = [*payload.get(results_key, []),
                           *({"doc_id": f"pad-{j}", "score": 0.0, "title": "padding"} for j in range(n))]
    return padded


def drip(wfile: Any, body: bytes, bytes_per_s: float) -> int:
    """Write ``body`` one byte every ``1 / bytes_per_s`` seconds (several a step above
    20 B/s); returns the bytes written before it ended or the client hung up."""
    step = max(1, int(bytes_per_s / 20))
    pause = step / bytes_per_s
    written = 0
    try:
        for start in range(0, len(body), step):
            wfile.write(body[start:start + step])
            written += len(body[start:start + step])
            time.sleep(pause)
    except OSError:
        pass
    return written


def flood(wfile: Any, n_bytes: int, chunk: int = 64 * 1024) -> int:
    """A chunked JSON body of about ``n_bytes`` (``{"results": [...]}``, valid when it
    ends), as fast as the client reads; returns the body bytes written before it ended
    or the client hung up."""
    item = b'{"doc_id": "flood", "score": 0.0, "title": "runaway body"}, '
    piece = item * max(1, chunk // len(item))
    written = 0
    try:
        for part in _flood_parts(n_bytes, piece):
            wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            written += len(part)
        wfile.write(b"0\r\n\r\n")
    except OSError:
        pass
    return written


def _flood_parts(n_bytes: int, piece: bytes) -> Any:
    yield b'{"results": ['
    sent = 0
    while sent < n_bytes:
        yield piece
        sent += len(piece)
    yield b'{"doc_id": "end"}]}'


def synthetic_responses(n_queries: int, n_results: int) -> dict[str, Any]:
    """Deterministic payloads for queries ``"query {i}"``: docs ``d{i}-{j}``, decreasing scores."""
    return {
        f"query {i}": {
            "results": [
                {"doc_id": f"d{i}-{j}", "score": round(1.0 - j / n_results, 4), "title": f"Document {i}-{j}"}
                for j in range(n_results)
            ],
            "confidence": round((i % 50) / 50, 2),
            "handoff": i % 10 == 0,
            "fallback_level": i % 3,
        }
        for i in range(n_queries)
    }


def main(argv: list[str] | None = None) -> None:
    """Serve synthetic responses until stdin closes (for benchmarks in another process):
    ``python tests/support/fake_search.py --queries 225 --results 50`` prints the URL."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--queries", type=int, default=225)
    parser.add_argument("--results", type=int, default=50)
    parser.add_argument("--delay-s", type=float, default=0.0, help="seconds every answer waits first")
    args = parser.parse_args(argv)
    delay = {"*": args.delay_s} if args.delay_s else {}
    with FakeSearch(synthetic_responses(args.queries, args.results), delay_s=delay) as svc:
        print(svc.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
