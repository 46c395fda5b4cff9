"""The lock of a config URL (target.channel: http): one lock file per document however
the URL is spelled, held by an flock that another process is refused (named)."""

from __future__ import annotations

import subprocess
import sys

from tuner.study.storage.file_locks import url_lock_file, url_locks

URL = "http://Engine.Example:9200/_search/pipeline/hybrid"


def test_one_document_one_lock_file_however_the_url_is_spelled() -> None:
    assert url_lock_file(URL) == url_lock_file("HTTP://engine.example:9200/_search/pipeline/hybrid/")
    assert url_lock_file(URL) != url_lock_file("http://engine.example:9200/_search/pipeline/other")


def test_another_process_is_refused_naming_the_holder() -> None:
    code = (
        "import sys; from tuner.study.storage.file_locks import url_locks\n"
        "from tuner.study.storage.lock_holder import LockHeld\n"
        "try:\n"
        "    with url_locks([sys.argv[1]], command='tuner run'): print('acquired')\n"
        "except LockHeld as exc: print(exc)\n"
    )
    with url_locks([URL], command="tuner run (first)"):
        done = subprocess.run([sys.executable, "-c", code, URL], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(f"config URL {URL} is locked by tuner run (first) (pid "), done.stdout + done.stderr
    again = subprocess.run([sys.executable, "-c", code, URL], capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == "acquired"
