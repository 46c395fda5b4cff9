"""A tiny backend that reloads (or pretends to): ``reload_server.py CONFIG PORT``.

GET /health -> 200 {"status": "ok", "pid", "reloads", "served": {"sha": <sha256 hex of the
config bytes it serves>}}. POST /admin/reload and SIGHUP re-read CONFIG, as told by
RELOAD_MODE:

- ``ok`` (default): re-read, answer 200 {"status": "reloaded"};
- ``refuse``: answer 409 {"error": "restart needed: server.port changed"}, keep the old bytes;
- ``stale``: answer 200 {"status": "reloaded"} but keep serving the old bytes.
"""

import hashlib
import http.server
import json
import os
import signal
import sys

path, port = sys.argv[1], int(sys.argv[2])
mode = os.environ.get("RELOAD_MODE", "ok")
state = {"sha": "", "reloads": 0}


def read() -> None:
    with open(path, "rb") as fh:
        state["sha"] = "sha256:" + hashlib.sha256(fh.read()).hexdigest().upper()


def reload() -> tuple[int, dict]:
    if mode == "refuse":
        return 409, {"error": "restart needed: server.port changed (8080 -> 9090)"}
    if mode == "ok":
        read()
    state["reloads"] += 1
    return 200, {"status": "reloaded"}


read()
signal.signal(signal.SIGHUP, lambda *_: reload())


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/health":
            return self.answer(404, {"error": "not found"})
        body = {"status": "ok", "pid": os.getpid(), "reloads": state["reloads"], "served": {"sha": state["sha"]}}
        self.answer(200, body)

    def do_POST(self) -> None:
        if self.path != "/admin/reload":
            return self.answer(404, {"error": f"no route {self.path}"})
        self.answer(*reload())

    def log_message(self, fmt: str, *args: object) -> None:
        print("request", fmt % args, flush=True)


server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print(f"listening on {port}", flush=True)
server.serve_forever()
