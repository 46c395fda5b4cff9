"""ConfigApplier against real backends: the reference backend on the demo data (reload by
POST /admin/reload and by SIGHUP, compared with a restart) and reload_server.py, a tiny
backend that refuses reloads or acks them without taking them."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.config.configpatch import ConfigPatcher
from tuner.config.experiment import free_port
from tuner.config.target import HealthConfig, ProcessConfig, ReloadConfig
from tuner.errors import BackendExited
from tuner.targets.health import wait_healthy
from tuner.targets.process import ProcessTarget
from tuner.targets.reload import UNKNOWN, Applied, ConfigApplier

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
BACKEND = ["{python}", "-m", "fusion_backend", "serve", "--config", "{config}", "--port", "{port}"]
RESTART_KEYS = ["data", "server", "sources.*.k1"]

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- harness


class Phases:
    """The ``phase`` argument of apply(): records the phase names in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str) -> Any:
        @contextmanager
        def cm() -> Iterator[None]:
            self.names.append(name)
            yield

        return cm()


class Backend:
    """A ProcessTarget on one config file, its patcher and its applier."""

    def __init__(self, tmp: Path, config: Path, command: list[str], reload: dict[str, Any] | None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.config = config
        self.health = HealthConfig(url=f"http://127.0.0.1:{self.port}/health", deadline_s=120)
        self.target = ProcessTarget(ProcessConfig(command=command, env=env or {}, stop_timeout_s=10),
                                    config_files=[config], port=self.port, state_dir=tmp / f"state-{self.port}")
        self.patcher = ConfigPatcher([config])
        reload_cfg = None
        if reload is not None:
            filled = json.loads(json.dumps(reload).replace("{port}", str(self.port)))
            reload_cfg = ReloadConfig.model_validate(filled)
        self.applier = ConfigApplier(self.target, self.wait, reload_cfg, self.health, [config])

    def wait(self) -> dict[str, Any]:
        return wait_healthy(self.health.url, deadline_s=self.health.deadline_s, target=self.target, interval_s=0.05)

    def start(self) -> None:
        self.target.start()
        self.wait()
        self.applier.mark_served({self.config: self.config.read_text(encoding="utf-8")})

    def apply(self, edits: dict[str, Any]) -> tuple[Applied, list[str]]:
        texts = self.patcher.render({0: edits})
        self.patcher.write(texts)
        phases = Phases()
        return self.applier.apply(texts, phases), phases.names

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def sha(self) -> str:
        return hashlib.sha256(self.config.read_bytes()).hexdigest()

    def close(self) -> None:
        self.applier.close()
        self.target.close()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Callable[..., Backend]]:
    made: list[Backend] = []

    def make(config: Path, command: list[str], reload: dict[str, Any] | None, **kw: Any) -> Backend:
        b = Backend(tmp_path, config, command, reload, **kw)
        made.append(b)
        b.start()
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo data and the demo's backend config, generated once for the module."""
    from tuner.ops.demo import generate_data, write_backend_config

    root = tmp_path_factory.mktemp("demo")
    generate_data(root / "data")
    write_backend_config(REPO / "backend" / "config.yaml", root / "backend" / "config.yaml",
                         root / "data" / "corpus.jsonl")
    return root


@pytest.fixture
def demo_config(demo: Path, tmp_path: Path) -> Path:
    """A test's own copy of the demo config (next to the shared one: relative paths and
    the index cache are shared)."""
    config = demo / "backend" / f"config-{tmp_path.name}.yaml"
    shutil.copyfile(demo / "backend" / "config.yaml", config)
    return config


def http_reload(**kw: Any) -> dict[str, Any]:
    return {"http": {"url": "http://127.0.0.1:{port}/admin/reload"}, "fingerprint": "config_fingerprint",
            "confirm_deadline_s": 60, **kw}


def sample_queries(demo: Path, n: int = 30) -> list[dict[str, Any]]:
    """``n`` demo queries, a third of them with a date hint (fallback tiers, recency)."""
    rows = [json.loads(line) for line in (demo / "data" / "queries.jsonl").read_text().splitlines() if line.strip()]
    dated = [r for r in rows if "date_hint_days" in r][: n // 3]
    plain = [r for r in rows if "date_hint_days" not in r][:: max(1, len(rows) // n)][: n - len(dated)]
    return dated + plain


def responses(b: Backend, queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Full /search answers (request_id, which differs per request, left out)."""
    out = []
    with httpx.Client(timeout=60) as client:
        for q in queries:
            body = {"query": q["query"], "top_k": 20, "query_id": q["query_id"],
                    **{k: q[k] for k in ("date_hint_days", "now") if k in q}}
            resp = client.post(b.url("/search"), json=body)
            assert resp.status_code == 200, resp.text
            answer = resp.json()
            answer.pop("request_id", None)
            out.append(answer)
    return out


# ---------------------------------------------------------------- reference backend

CONFIGS = {
    "rrf weights and k": {"fusion.method": "rrf", "fusion.rrf_k": 15, "fusion.weights": {"bm25": 0.4, "dense": 1.6}},
    "linear fusion, z normalisation": {"fusion.method": "linear", "fusion.normalization": "z",
                                       "fusion.weights": {"bm25": 0.7, "dense": 0.3}, "confidence.threshold": 0.3},
    "recency and fallback windows": {"recency.weight": 0.6, "recency.half_life_days": 45,
                                     "fallback.windows_days": [7, 40]},
}


def test_a_reloaded_backend_serves_exactly_what_a_restarted_one_serves(
        demo: Path, demo_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(demo_config, BACKEND, http_reload())
    queries = sample_queries(demo)
    assert len(queries) == 30 and any("date_hint_days" in q for q in queries)
    seen_levels, seen_handoff = set(), set()
    previous = responses(b, queries)
    for name, edits in CONFIGS.items():
        pid = b.target.pid
        applied, phases = b.apply(edits)
        assert (applied.mode, applied.reason, phases) == ("reload", None, ["reload", "confirm"]), name
        assert applied.health["config_fingerprint"] == b.sha() and b.target.pid == pid, name
        reloaded = responses(b, queries)

        b.applier.forget()  # the same texts again, by restart
        applied, phases = b.apply(edits)
        assert (applied.mode, applied.reason, phases) == ("restart", UNKNOWN, ["restart", "health"]), name
        assert b.target.pid != pid and applied.health["config_fingerprint"] == b.sha(), name
        restarted = responses(b, queries)

        for q, got, want in zip(queries, reloaded, restarted, strict=True):
            assert got == want, f"{name}: {q['query_id']}"
        assert reloaded != previous, f"{name} changed no answer: the comparison proves nothing"
        previous = reloaded
        seen_levels |= {r.get("fallback_level") for r in reloaded}
        seen_handoff |= {r.get("handoff") for r in reloaded}
        assert any(r["results"] for r in reloaded), name
    # the comparison covered more than one fallback tier and both handoff outcomes
    assert len(seen_levels) > 1 and seen_handoff == {True, False}


def test_a_restart_only_key_forces_a_restart_and_a_fusion_change_reloads(
        demo_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(demo_config, BACKEND, http_reload(restart_keys=RESTART_KEYS))
    pid = b.target.pid
    applied, phases = b.apply({"sources.bm25.k1": 1.1})
    assert applied.mode == "restart" and phases == ["restart", "health"]
    assert applied.reason == "sources.bm25.k1 changed (1.5 -> 1.1): a restart-only key"
    assert b.target.pid != pid
    assert httpx.get(b.url("/admin/config")).json()["sources"]["bm25"]["k1"] == 1.1

    pid = b.target.pid
    applied, phases = b.apply({"fusion.rrf_k": 33})
    assert (applied.mode, applied.reason, phases) == ("reload", None, ["reload", "confirm"])
    assert b.target.pid == pid
    assert httpx.get(b.url("/admin/config")).json()["fusion"]["rrf_k"] == 33
    assert applied.health["reloads"] == 1


@pytest.mark.parametrize("how", ["http", "signal"])
def test_http_reload_and_sighup_are_both_confirmed(
        how: str, demo_config: Path, backend: Callable[..., Backend]) -> None:
    reload = http_reload() if how == "http" else {"signal": "SIGHUP", "fingerprint": "config_fingerprint",
                                                    "confirm_deadline_s": 60}
    b = backend(demo_config, BACKEND, reload)
    pid = b.target.pid
    for k in (21, 42):
        applied, phases = b.apply({"fusion.rrf_k": k, "citation.min_score": k / 100})
        assert (applied.mode, applied.reason, phases) == ("reload", None, ["reload", "confirm"])
        assert applied.health["config_fingerprint"] == b.sha()
        live = httpx.get(b.url("/admin/config")).json()
        assert (live["fusion"]["rrf_k"], live["citation"]["min_score"]) == (k, pytest.approx(k / 100))
    assert b.target.pid == pid
    assert b.applier.served == {demo_config: demo_config.read_text(encoding="utf-8")}


def test_a_backend_refusing_the_reload_on_a_bad_config_is_restarted_and_the_restart_fails(
        demo_config: Path, backend: Callable[..., Backend]) -> None:
    """A config the loader rejects: the reload is refused (400), the restart fails too,
    the error propagates and what the backend serves becomes unknown."""
    b = backend(demo_config, BACKEND, http_reload())
    with pytest.raises(BackendExited):
        b.apply({"fusion.method": "nonsense"})
    assert b.applier.served is None
    applied, _ = b.apply({"fusion.method": "rrf"})
    assert (applied.mode, applied.reason) == ("restart", UNKNOWN)


# ---------------------------------------------------------------- reload_server.py

SERVER = ["{python}", str(HERE / "reload_server.py"), "{config}", "{port}"]
TINY = ["{python}", str(HERE / "tiny_server.py"), "{config}", "{port}"]


@pytest.fixture
def small_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("fusion: {k: 1}  # the backend's config\nserver: {port: 8080}\n", encoding="utf-8")
    return path


def test_a_refused_reload_falls_back_to_a_restart_and_says_why(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(small_config, SERVER, http_reload(fingerprint="served.sha"), env={"RELOAD_MODE": "refuse"})
    pid = b.target.pid
    applied, phases = b.apply({"fusion.k": 2})
    assert applied.mode == "restart" and phases == ["reload", "restart", "health"]
    assert applied.reason == (f"reload refused: HTTP 409 from POST {b.url('/admin/reload')}: "
                              "restart needed: server.port changed (8080 -> 9090)")
    assert b.target.pid != pid and applied.health["served"]["sha"] == "sha256:" + b.sha().upper()


def test_a_reload_url_that_does_not_exist_falls_back_to_a_restart(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    reload = http_reload(fingerprint="served.sha")
    reload["http"] = {"url": "http://127.0.0.1:{port}/admin/nope"}
    b = backend(small_config, SERVER, reload)
    applied, _ = b.apply({"fusion.k": 2})
    assert applied.mode == "restart"
    assert applied.reason == f"reload refused: HTTP 404 from POST {b.url('/admin/nope')}: no route /admin/nope"


def test_an_acked_reload_that_did_not_take_is_not_confirmed_and_restarts(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(small_config, SERVER, http_reload(fingerprint="served.sha", confirm_deadline_s=0.5),
                env={"RELOAD_MODE": "stale"})
    old = b.sha()
    pid = b.target.pid
    applied, phases = b.apply({"fusion.k": 2})
    assert applied.mode == "restart" and phases == ["reload", "confirm", "restart", "health"]
    assert applied.reason == f"reload not confirmed within 0.5 s: backend serves {old[:12]}, wrote {b.sha()[:12]}"
    assert b.target.pid != pid and applied.health["served"]["sha"] == "sha256:" + b.sha().upper()


def test_a_reload_server_confirms_by_signal_with_a_prefixed_fingerprint(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(small_config, SERVER, {"signal": "SIGHUP", "fingerprint": "served.sha", "confirm_deadline_s": 60})
    pid = b.target.pid
    applied, _ = b.apply({"fusion.k": 3})
    assert (applied.mode, applied.reason, applied.health["reloads"]) == ("reload", None, 1)
    assert b.target.pid == pid


def test_a_missing_fingerprint_field_falls_back_at_once_and_names_the_keys(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(small_config, SERVER, http_reload(fingerprint="served.nope", confirm_deadline_s=120))
    applied, _ = b.apply({"fusion.k": 2})
    assert applied.mode == "restart" and applied.reason is not None
    assert applied.reason.startswith("reload not confirmed within 120 s: the health answer has no 'served.nope'")
    assert "keys: pid, reloads, served, status" in applied.reason


def test_a_backend_killed_by_the_signal_fails_the_apply_and_the_next_one_restarts(
        small_config: Path, backend: Callable[..., Backend]) -> None:
    """tiny_server.py has no SIGHUP handler: the signal kills it."""
    b = backend(small_config, TINY, {"signal": "SIGHUP", "fingerprint": "config", "confirm_deadline_s": 60})
    with pytest.raises(BackendExited, match="backend exited after SIGHUP .*killed by SIGHUP"):
        b.apply({"fusion.k": 2})
    assert b.applier.served is None
    applied, phases = b.apply({"fusion.k": 3})
    assert (applied.mode, applied.reason, phases) == ("restart", UNKNOWN, ["restart", "health"])
    assert applied.health["config"] == small_config.read_text()


def test_without_reload_every_apply_restarts(small_config: Path, backend: Callable[..., Backend]) -> None:
    b = backend(small_config, TINY, None)
    pid = b.target.pid
    applied, phases = b.apply({"fusion.k": 2})
    assert (applied.mode, applied.reason, phases) == ("restart", None, ["restart", "health"])
    assert b.target.pid != pid and applied.health["config"] == small_config.read_text()


def test_a_signal_needs_a_target_that_can_take_one_and_a_running_backend(tmp_path: Path, small_config: Path) -> None:
    from tuner.errors import TargetError
    from tuner.targets.none import NoneTarget

    with pytest.raises(TargetError, match="cannot take a signal .*use target.reload.http"):
        NoneTarget().send_signal("SIGHUP")
    target = ProcessTarget(ProcessConfig(command=TINY), config_files=[small_config], port=free_port(),
                           state_dir=tmp_path / "state")
    with pytest.raises(TargetError, match="cannot send SIGHUP: the backend process is not running"):
        target.send_signal("SIGHUP")
