"""A search backend with injectable faults, run by the fault suite as a process target:

    python fault_backend.py --config CONFIG --port PORT --state DIR [--plan PLAN.json]

It serves ``GET /health`` and ``POST /search`` ({"query_id", "query", "top_k"}) and
answers every query with ten documents: the query's one relevant document
``<qid>-rel`` at rank ``fusion.depth`` of CONFIG, read at start-up, and judged
irrelevant ``<qid>-d<j>`` around it. So a trial's score is a known function of its
own ``fusion.depth``: a score measured on another config shows.

Each start is one *life*, numbered 1, 2, ... in ``DIR/lives`` (a tuner run starts
the backend for its preflight, restarts it once per measured trial and once more to
restore). PLAN maps a life number (or "*", every life) to its faults::

    {"3": {"crash_after": 2}}       # hard exit (no answer) on the 3rd search request
    {"3": {"never_healthy": true}}  # /health answers 503 for ever
    {"3": {"health_delay_s": 5}}    # /health answers 503 for the first 5 s
    {"3": {"status": 503}}          # every search answers 503 ("status_first": N: the first N only)
    {"3": {"stall_s": 3}}           # every search waits 3 s first ("stall_first": N: the first N only)
    {"3": {"hold_until": "PATH"}}   # every search waits until PATH exists (the test releases it)
    {"3": {"malformed": "truncated"}}  # 200 with a broken body: truncated | html | wrong-shape
    {"depth=7": {"hold_until": "PATH"}}  # the faults of every life whose config has fusion.depth 7
    {"request:depth=7": {"hold_until": "PATH"}}  # the faults of every search whose request asks for depth 7

A search body may carry ``overrides: {fusion: {depth: N}}`` (the request channel's shape,
as the reference backend's per-request overrides): that search is answered at depth N,
whatever the config says, and its event records the depth it was answered at.

``/health`` and the start event report ``config_fingerprint``, the sha256 of CONFIG's
bytes as read at start-up (as the reference backend does), so a test can tell which file
a life serves.

Every start and search is appended to ``DIR/events.jsonl`` (one write per line), so a
test can wait for "life 3 is serving" before it signals the tuner. The plan's faults
are what the tuner must survive, the events are how the suite times them.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

N_DOCS = 10
CRASH_EXIT = 3
HOLD_MAX_S = 300.0  # a held search gives up after this, should a test never release it


def answer(query_id: str, depth: int, top_k: int = N_DOCS) -> dict[str, Any]:
    """The response to ``query_id`` on a config with ``fusion.depth = depth``."""
    depth = min(max(int(depth), 1), N_DOCS)
    others = iter(f"{query_id}-d{j}" for j in range(N_DOCS))
    docs = [f"{query_id}-rel" if rank == depth else next(others) for rank in range(1, N_DOCS + 1)]
    results = [{"doc_id": d, "score": round(1.0 - i / N_DOCS, 3), "title": d} for i, d in enumerate(docs[:top_k])]
    return {"results": results, "confidence": 0.9, "handoff": False}


def read_depth(config: Path) -> int:
    from ruamel.yaml import YAML

    doc = YAML(typ="safe", pure=True).load(config.read_text())
    return int(doc["fusion"]["depth"])


class Life:
    """One start of the backend: its number, config and faults, and a search counter."""

    def __init__(self, state: Path, number: int, depth: int, faults: dict[str, Any], fingerprint: str = "") -> None:
        self.state = state
        self.number = number
        self.depth = depth
        self.fingerprint = fingerprint
        self.faults = faults
        #: the faults of a search whose request asks for a depth (plan key "request:depth=N")
        self.request_faults: dict[int, dict[str, Any]] = {}
        self.started = time.monotonic()
        self.searches = 0
        self._lock = threading.Lock()

    def log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"life": self.number, "pid": os.getpid(), "event": event, "t": time.time(), **fields})
        fd = os.open(self.state / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def next_search(self) -> int:
        with self._lock:
            self.searches += 1
            return self.searches

    def healthy(self) -> bool:
        if self.faults.get("never_healthy"):
            return False
        return time.monotonic() - self.started >= float(self.faults.get("health_delay_s", 0))


def next_life(state: Path) -> int:
    """The number of this start (1, 2, ...), counted under an flock in ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / "lives", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 64).decode().strip()
        number = int(text or 0) + 1
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(number).encode())
        return number
    finally:
        os.close(fd)


def faults_for(plan: dict[str, Any], life: int, depth: int | None = None) -> dict[str, Any]:
    return {**plan.get("*", {}), **plan.get(f"depth={depth}", {}), **plan.get(str(life), {})}


def make_handler(life: Life) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/health":
                self._send(404, b'{"detail": "not found"}')
            elif life.healthy():
                self._send(200, json.dumps({"status": "ok", "life": life.number, "depth": life.depth,
                                                  "config_fingerprint": life.fingerprint}).encode())
            else:
                self._send(503, b'{"status": "starting"}')

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?")[0] != "/search":
                self._send(404, b'{"detail": "not found"}')
                return
            body = json.loads(raw or b"{}")
            n = life.next_search()
            query_id = str(body.get("query_id"))
            asked = ((body.get("overrides") or {}).get("fusion") or {}).get("depth")
            depth = life.depth if asked is None else int(asked)
            life.log("search", n=n, query_id=query_id, depth=depth)
            f = life.faults if asked is None else {**life.faults, **life.request_faults.get(depth, {})}
            if "crash_after" in f and n > int(f["crash_after"]):
                life.log("crash", n=n)
                os._exit(CRASH_EXIT)  # mid-batch, with requests in flight: no answer, no clean-up
            if "hold_until" in f:
                release, deadline = Path(f["hold_until"]), time.monotonic() + HOLD_MAX_S
                while not release.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            if "stall_s" in f and n <= int(f.get("stall_first", 1 << 30)):
                time.sleep(float(f["stall_s"]))
            if "status" in f and n <= int(f.get("status_first", 1 << 30)):
                self._send(int(f["status"]), json.dumps({"detail": f"injected {f['status']}"}).encode())
                return
            malformed = f.get("malformed")
            if malformed == "truncated":
                self._send(200, json.dumps(answer(query_id, depth)).encode()[:40])
            elif malformed == "html":
                self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
            elif malformed == "wrong-shape":
                self._send(200, json.dumps({"results": "see /v2/search", "depth": depth}).encode())
            else:
                top_k = int(body.get("top_k") or N_DOCS)
                self._send(200, json.dumps(answer(query_id, depth, top_k)).encode())

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that give up on a stalled request reset the connection on purpose


def serve(config: Path, port: int, state: Path, plan: dict[str, Any]) -> Server:
    """A started server for one life (the caller runs ``serve_forever``)."""
    import hashlib

    number = next_life(state)
    raw = config.read_bytes()
    depth = read_depth(config)
    life = Life(state, number, depth, faults_for(plan, number, depth), hashlib.sha256(raw).hexdigest())
    prefix = "request:depth="
    life.request_faults = {int(key[len(prefix):]): dict(f) for key, f in plan.items() if key.startswith(prefix)}
    server = Server(("127.0.0.1", port), make_handler(life))
    life.log("start", depth=life.depth, faults=life.faults, config=str(config), config_fingerprint=life.fingerprint)
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--plan", type=Path)
    args = ap.parse_args()
    plan = json.loads(args.plan.read_text()) if args.plan and args.plan.exists() else {}
    serve(args.config, args.port, args.state, plan).serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
