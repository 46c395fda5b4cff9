"""A logging reverse proxy in front of a search backend: what the backend saw, and when.

    proxy = RequestLogProxy("http://127.0.0.1:8000").start()   # proxy.url -> point the tuner at it
    ...
    proxy.close()
    proxy.entries    # every request forwarded: came in, answered (monotonic ns), its body

It forwards each request as it comes (one thread per connection) and records the moment
it came in and the moment its answer went back, both on this process's monotonic clock,
so two requests' intervals can be compared. `overlapping` says whether requests carrying
different values were in flight at the same moment: an outcome of what ran, never a
speed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


@dataclass(frozen=True)
class Entry:
    began_ns: int
    ended_ns: int
    path: str
    body: dict[str, Any]
    status: int


class RequestLogProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=120)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RequestLogProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def _forward(self, method: str) -> None:
                began = time.monotonic_ns()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                try:
                    answer = proxy._client.request(method, proxy.upstream + self.path, content=raw, headers=headers)
                    status, content = answer.status_code, answer.content
                    kind = answer.headers.get("content-type", "application/json")
                except httpx.HTTPError as exc:
                    status, content, kind = 502, json.dumps({"detail": str(exc)}).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                with proxy._lock:
                    proxy.entries.append(Entry(began, time.monotonic_ns(), self.path, body, status))

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 64

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="request-log-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._client.close()


def overlapping(entries: Sequence[Entry], values: Callable[[Entry], str]) -> list[tuple[Entry, Entry]]:
    """Pairs of requests with different ``values`` that were in flight at the same moment
    (each came in before the other's answer went back)."""
    pairs = []
    ordered = sorted(entries, key=lambda e: e.began_ns)
    active: list[Entry] = []
    for entry in ordered:
        active = [a for a in active if a.ended_ns > entry.began_ns]
        pairs += [(a, entry) for a in active if values(a) != values(entry)]
        active.append(entry)
    return pairs
