"""A tiny backend for target tests: ``tiny_server.py CONFIG PORT``.

GET /health -> 200 {"status": "ok", "pid", "config": <text of CONFIG read at start-up>}.
Env: TINY_IGNORE_TERM=1 ignores SIGTERM; TINY_CHILD_PIDFILE=PATH forks a sleeping child
and writes its pid there (to check that a stop ends the whole process group).
"""

import http.server
import json
import os
import signal
import subprocess
import sys

config_text = open(sys.argv[1]).read()
port = int(sys.argv[2])
# No SIGHUP handler means dying of it, even when the tests were started under nohup (which
# ignores SIGHUP, and an ignored signal stays ignored across fork and exec).
signal.signal(signal.SIGHUP, signal.SIG_DFL)
if os.environ.get("TINY_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("TINY_CHILD_PIDFILE"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.environ["TINY_CHILD_PIDFILE"], "w") as fh:
        fh.write(str(child.pid))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "pid": os.getpid(), "config": config_text}).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: object) -> None:
        print("request", fmt % args, flush=True)


server = http.server.HTTPServer(("127.0.0.1", port), Handler)
print(f"listening on {port}", flush=True)
server.serve_forever()
