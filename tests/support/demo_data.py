"""The seeded demo data set, generated once per test run and copied where a test wants it.

    copy_demo_data(dest) -> dest   # corpus.jsonl, queries.jsonl, qrels.txt, manifest.json

Generating it (``fusion_backend.datagen``'s ``write_demo``) costs seconds of CPU; a dozen
test projects wanted it. The first caller of a run writes it into $TUNER_TEST_DEMO_DATA
(made by tests/conftest.py, inherited by every xdist worker) under a key of the
generator's source and seed, so a changed generator is never served stale data; the
others copy it (a copy, not a link: tests cut and rewrite the files). Tests of the
generator itself still call it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

DEMO_DATA_ENV = "TUNER_TEST_DEMO_DATA"
FILES = ("corpus.jsonl", "queries.jsonl", "qrels.txt", "manifest.json")


def _key(seed: int) -> str:
    import fusion_backend.datagen as datagen

    digest = hashlib.sha256(str(seed).encode())
    for source in sorted(Path(datagen.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> Path:
    folder = os.environ.get(DEMO_DATA_ENV)
    if folder:
        return Path(folder)
    # Outside a pytest session (a test module run by hand): a private folder per process.
    made = Path(tempfile.mkdtemp(prefix="fusion-tuner-test-demo-data-"))
    os.environ[DEMO_DATA_ENV] = str(made)
    return made


def cached_demo_data(seed: int | None = None) -> Path:
    """The run's one generated copy (read-only by convention: use ``copy_demo_data``)."""
    from fusion_backend.datagen import DEFAULT_SEED, write_demo

    seed = DEFAULT_SEED if seed is None else seed
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    done = cache / f"demo-{_key(seed)}"
    if done.is_dir():
        return done
    with open(cache / f"demo-{_key(seed)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be generating it right now
        if not done.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".demo-"))
            write_demo(tmp, seed)
            tmp.rename(done)
    return done


def copy_demo_data(dest: Path, seed: int | None = None) -> Path:
    """``dest`` (created) holding the demo data files, as ``write_demo(dest)`` writes them."""
    source = cached_demo_data(seed)
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(source / name, dest / name)
    return dest


def copy_demo_subset(dest: Path, n_in_scope: int) -> Path:
    """``copy_demo_data(dest)`` with the query set cut to its first ``n_in_scope`` in-scope
    queries and every out-of-scope one (a trial then takes about a second)."""
    import json

    copy_demo_data(dest)
    rows = [json.loads(line) for line in (dest / "queries.jsonl").read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r["scope"] == "in"][:n_in_scope] + [r for r in rows if r["scope"] == "oos"]
    (dest / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return dest
