"""Command line: the only module that prints and sets exit codes (also for the data
tools' ``__main__`` modules, through ``run_data_tool``).

    fusion-backend serve --config PATH [--host H] [--port P] [--config-store JSON]
        # SIGHUP / POST /admin/reload re-read PATH (or the store, once PUT /admin/config wrote it)
    fusion-backend build-index --config PATH      # fill the index cache, then exit
    fusion-backend check-config --config PATH     # validate, print the effective config

Exit codes: 0 ok / stopped by SIGTERM; 1 the index could not be loaded; 2 invalid
config or usage (nothing was bound).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import BackendError

PROG = "fusion-backend"


def main(argv: Sequence[str] | None = None) -> int:
    # Until uvicorn installs its handlers, SIGTERM must still stop us promptly (PID 1
    # in a container has no default action for it).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(message)s", stream=sys.stderr)
    logging.getLogger("fusion_backend").setLevel(logging.INFO)  # libraries stay at WARNING
    try:
        return int(args.run(args))
    except BackendError as exc:
        kind = "config error" if exc.exit_code == 2 else "error"
        print(f"{PROG}: {kind}: {exc}", file=sys.stderr)
        return exc.exit_code


def run_data_tool(action: Callable[[], str]) -> int:
    """Exit status of a data tool (``python -m fusion_backend.datagen`` / ``.importers``):
    ``action()``'s summary on stdout and 0, or one ``error:`` line (where, what, fix) on
    stderr and the error's exit code (2) when the input or the output directory is bad."""
    # Imported here: the service itself never loads the importers.
    from .importers.errors import DataFormatError

    try:
        summary = action()
    except DataFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(summary)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .reload import ConfigSource
    from .server import serve

    # SIGHUP means "reload" (server.py); until that handler is set, one must not kill us.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The path as given (made absolute, symlinks not resolved): a reload re-reads it,
    # so a swapped symlink (a Kubernetes ConfigMap) is followed.
    store = args.config_store.absolute() if args.config_store is not None else None
    source = ConfigSource(args.config.absolute(), host=args.host, port=args.port, store=store)
    cfg, fingerprint = source.read()
    if store is not None and store.exists():
        logging.getLogger("fusion_backend").info(
            "serving the config store %s (PUT /admin/config), not %s", store, args.config
        )
    return serve(source, cfg, fingerprint, access_log=args.access_log, log_level=args.log_level)


def _build_index(args: argparse.Namespace) -> int:
    from .config import load_config
    from .index import load_index

    index = load_index(load_config(args.config))
    print(
        json.dumps(
            {"corpus_size": len(index.docs), "cache_hits": index.cache_hits, "seconds": round(index.load_seconds, 3)}
        )
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from .config import load_config

    cfg = load_config(args.config)
    print(json.dumps({"config_hash": cfg.hash(), "config": cfg.to_json()}, indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Reference hybrid search service for fusion-tuner.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the search API")
    serve.add_argument("--host", help="bind address (overrides server.host)")
    serve.add_argument("--port", type=int, help="port (overrides server.port)")
    serve.add_argument(
        "--config-store",
        type=Path,
        help="JSON file PUT /admin/config writes; when it exists it is served instead of --config (every key)",
    )
    serve.add_argument("--access-log", action="store_true", help="log every request (off: it costs latency)")
    serve.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="uvicorn's log level"
    )
    serve.set_defaults(run=_serve)
    build = sub.add_parser("build-index", help="build the index cache for a config, then exit")
    build.set_defaults(run=_build_index)
    check = sub.add_parser("check-config", help="validate a config and print it as JSON")
    check.set_defaults(run=_check_config)
    for p in (serve, build, check):
        p.add_argument("--config", type=Path, required=True, help="path to config.yaml")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)
