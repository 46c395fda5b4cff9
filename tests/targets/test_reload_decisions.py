"""tuner.targets.reload's pure decisions, and the ``target.reload`` section's validation."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from tuner.config.configpatch import ConfigPatcher
from tuner.config.target import ReloadConfig, TargetConfig
from tuner.targets.reload import UNKNOWN, expected_fingerprint, normalize_fingerprint, restart_reason

CFG = Path("/srv/config.yaml")
BASE = """\
data:
  corpus: data/corpus.jsonl   # a comment
  runs: {}
server: {host: 127.0.0.1, port: 8080}
sources:
  bm25: {type: bm25, k1: 1.2, b: 0.75}
  dense: {type: dense, dims: 128}
fusion:
  method: rrf
  weights: {bm25: 1.0, dense: 1.0}
fallback:
  windows_days: [30, 90]
"""


def reason(new_text: str, keys: list[str], old_text: str = BASE) -> str | None:
    return restart_reason({CFG: old_text}, {CFG: new_text}, keys)


def test_unchanged_or_unwatched_changes_need_no_restart() -> None:
    assert reason(BASE, ["data", "sources.*.k1"]) is None
    assert reason(BASE.replace("method: rrf", "method: linear"), ["data", "sources.*.k1"]) is None
    # comments and formatting are no change of value
    assert reason(BASE.replace("# a comment", "# another").replace("k1: 1.2", "k1: 1.20"), ["data", "sources"]) is None
    assert reason(BASE.replace("method: rrf", "method: linear"), []) is None


def test_a_wildcard_matches_one_segment_and_names_the_concrete_key() -> None:
    got = reason(BASE.replace("k1: 1.2", "k1: 1.5"), ["sources.*.k1"])
    assert got == "sources.bm25.k1 changed (1.2 -> 1.5): a restart-only key"
    assert reason(BASE.replace("dims: 128", "dims: 64"), ["sources.*.k1"]) is None
    assert reason(BASE.replace("dims: 128", "dims: 64"), ["*.dense.dims"]) == \
        "sources.dense.dims changed (128 -> 64): a restart-only key"


def test_a_nested_change_under_a_restart_key_names_the_deepest_key() -> None:
    got = reason(BASE.replace("data/corpus.jsonl", "data/other.jsonl"), ["data"])
    assert got == 'data.corpus changed ("data/corpus.jsonl" -> "data/other.jsonl"): a restart-only key'
    assert reason(BASE.replace("port: 8080", "port: 9090"), ["server"]) == \
        "server.port changed (8080 -> 9090): a restart-only key"


def test_list_values_are_compared_whole_and_by_index() -> None:
    new = BASE.replace("[30, 90]", "[14, 60]")
    assert reason(new, ["fallback.windows_days"]) == \
        "fallback.windows_days changed ([30, 90] -> [14, 60]): a restart-only key"
    assert reason(BASE.replace("[30, 90]", "[30, 60]"), ["fallback.windows_days.0"]) is None
    assert reason(BASE.replace("[30, 90]", "[30, 60]"), ["fallback.windows_days.*"]) == \
        "fallback.windows_days.1 changed (90 -> 60): a restart-only key"


def test_added_and_removed_keys() -> None:
    added = BASE.replace("  runs: {}", "  runs: {splade: runs/splade.trec}")
    assert reason(added, ["data"]) == 'data.runs.splade added ("runs/splade.trec"): a restart-only key'
    assert reason(BASE, ["data"], old_text=added) == \
        'data.runs.splade removed (was "runs/splade.trec"): a restart-only key'
    new_source = BASE.replace("fusion:", "  splade: {type: run, k1: 0.9}\nfusion:")
    assert reason(new_source, ["sources.*.k1"]) == "sources.splade.k1 added (0.9): a restart-only key"


def test_types_matter_but_int_and_float_spellings_do_not() -> None:
    assert reason(BASE.replace("k1: 1.2", "k1: true"), ["sources"]) is not None
    assert reason(BASE.replace("dims: 128", "dims: 128.0"), ["sources"]) is None


def test_unknown_served_config_needs_a_restart() -> None:
    assert restart_reason(None, {CFG: BASE}, ["data"]) == UNKNOWN
    assert "unknown" in restart_reason({}, {CFG: BASE}, [])  # type: ignore[operator]


def test_secret_values_are_not_shown() -> None:
    old = BASE.replace("  runs: {}", "  runs: {}\n  db_password: hunter2-secret")
    got = reason(old.replace("hunter2-secret", "other-secret-9"), ["data"], old_text=old)
    assert got == "data.db_password changed (*** -> ***): a restart-only key"


def test_several_files_are_named_in_the_reason() -> None:
    other = Path("/srv/sources.yaml")
    served = {CFG: BASE, other: "bm25: {k1: 1.2}\n"}
    assert restart_reason(served, {CFG: BASE, other: "bm25: {k1: 1.4}\n"}, ["bm25"]) == \
        "sources.yaml: bm25.k1 changed (1.2 -> 1.4): a restart-only key"


def test_expected_fingerprint_is_the_sha256_of_the_bytes_the_patcher_writes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("x: 1\n")
    second.write_text("y: 2\n")
    patcher = ConfigPatcher([first, second])
    texts = patcher.render({1: {"y": "ünïcode ✓"}})
    patcher.write(texts)
    assert expected_fingerprint(texts, 1) == hashlib.sha256(second.read_bytes()).hexdigest()
    assert expected_fingerprint(texts, 0) == hashlib.sha256(b"x: 1\n").hexdigest()
    assert expected_fingerprint(["x: 1\r\n"], 0) == hashlib.sha256(b"x: 1\r\n").hexdigest()


def test_reported_fingerprints_are_normalised() -> None:
    assert normalize_fingerprint("SHA256:ABCdef") == "abcdef"
    assert normalize_fingerprint(" abc ") == "abc"


# ---------------------------------------------------------------- config validation

HEALTH = {"url": "http://127.0.0.1:{port}/health"}
PROCESS = {"command": ["backend"]}


def target(reload: dict, **kw: object) -> TargetConfig:
    return TargetConfig.model_validate({"config_files": ["c.yaml"], "process": PROCESS, "health": HEALTH,
                                        "reload": reload, **kw})


def error(reload: dict, **kw: object) -> str:
    with pytest.raises(ValidationError) as info:
        target(reload, **kw)
    return str(info.value)


def test_a_valid_reload_section() -> None:
    http = target({"http": {"url": "http://127.0.0.1:{port}/admin/reload"}, "fingerprint": "config_fingerprint",
                   "restart_keys": ["data", "sources.*.k1"]}).reload
    assert http is not None and http.http is not None
    assert (http.http.method, http.http.timeout_s, http.fingerprint_file, http.confirm_deadline_s) == \
        ("POST", 30, 0, 10)
    assert target({"signal": "hup", "fingerprint": "a.b"}).reload.signal == "SIGHUP"  # type: ignore[union-attr]
    plain = {"config_files": ["c.yaml"], "process": PROCESS, "health": HEALTH}
    assert TargetConfig.model_validate(plain).reload is None


def test_both_http_and_signal_or_neither_are_refused() -> None:
    assert "either http or signal, not both" in error({"http": {"url": "u"}, "signal": "SIGHUP", "fingerprint": "f"})
    assert "http: {url: ...} or signal: SIGHUP" in error({"fingerprint": "f"})


def test_fingerprint_is_required_and_dotted() -> None:
    assert "give fingerprint:" in error({"signal": "SIGHUP"})
    assert "fingerprint" in error({"signal": "SIGHUP", "fingerprint": "a..b"})


def test_reload_with_apply_none_is_refused() -> None:
    assert "apply: none" in error({"signal": "SIGHUP", "fingerprint": "f"}, apply="none")


def test_bad_signal_restart_key_and_file_index_are_refused() -> None:
    assert "unknown signal 'SIGNOPE'" in error({"signal": "SIGNOPE", "fingerprint": "f"})
    assert "not a dotted path" in error({"signal": "SIGHUP", "fingerprint": "f", "restart_keys": ["a..b"]})
    assert "fingerprint_file 1 is out of range" in error({"signal": "SIGHUP", "fingerprint": "f",
                                                          "fingerprint_file": 1})
    with pytest.raises(ValidationError):
        ReloadConfig.model_validate({"signal": "SIGHUP", "fingerprint": "f", "bogus": 1})


def test_bind_port_fills_the_reload_url(tmp_path: Path) -> None:
    from tuner.config.experiment import load_experiment

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "config.yaml").write_text(BASE)
    (tmp_path / "space.yaml").write_text("params: {}\n")
    (tmp_path / "q.jsonl").write_text('{"query_id": "q1", "query": "x"}\n')
    (tmp_path / "exp.yaml").write_text("""\
study: s
n_trials: 1
dataset: {queries: q.jsonl}
target:
  config_files: [config.yaml]
  process: {command: [backend, --port, "{port}"]}
  health: {url: "http://127.0.0.1:{port}/health"}
  reload:
    http: {url: "http://127.0.0.1:{port}/admin/reload"}
    fingerprint: config_fingerprint
evaluation:
  request: {url: "http://127.0.0.1:{port}/search"}
search_space: space.yaml
""")
    exp = load_experiment(tmp_path / "exp.yaml", check_paths=False).bind_port(4321)
    assert exp.target.reload.http.url == "http://127.0.0.1:4321/admin/reload"  # type: ignore[union-attr]
    assert exp.target.health.url == "http://127.0.0.1:4321/health"


def test_worker_replicas_need_the_port_placeholder_in_the_reload_url() -> None:
    from types import SimpleNamespace

    from tuner.errors import ConfigError
    from tuner.targets.replicas import _check_port_placeholders

    def experiment(url: str) -> SimpleNamespace:
        t = target({"http": {"url": url}, "fingerprint": "f"}, process={"command": ["backend", "--port", "{port}"]})
        return SimpleNamespace(target=t, evaluation=SimpleNamespace(request=SimpleNamespace(url="http://h:{port}/s")))

    _check_port_placeholders(experiment("http://127.0.0.1:{port}/admin/reload"))
    with pytest.raises(ConfigError, match="target.reload.http.url .* has no \\{port\\}"):
        _check_port_placeholders(experiment("http://127.0.0.1:8080/admin/reload"))


def test_the_applier_compares_restart_keys_on_texts_parsed_ahead(tmp_path: Path, monkeypatch) -> None:
    """``prepare`` (a pipelined trial's begin) parses the texts; ``apply`` (on the
    backend's path) then parses nothing, and decides as the uncached comparison does."""
    from types import SimpleNamespace

    import tuner.targets.reload as reload_mod
    from tuner.config.target import HealthConfig
    from tuner.targets.reload import ConfigApplier

    config = tmp_path / "config.yaml"
    config.write_text(BASE)
    restarts: list[int] = []
    target = SimpleNamespace(restart=lambda: restarts.append(1))
    reload = ReloadConfig(signal="SIGHUP", fingerprint="config_fingerprint", restart_keys=["sources.*.k1"])
    applier = ConfigApplier(target, lambda: {"status": "ok"}, reload, HealthConfig(url="http://127.0.0.1:1/health"),
                            [config], served={config: BASE})
    changed = BASE.replace("k1: 1.2", "k1: 1.5")
    expected = reason(changed, ["sources.*.k1"])
    applier.prepare({config: BASE})
    applier.prepare({config: changed})

    def no_parse(text: str) -> None:
        raise AssertionError("parsed on the backend's path")

    monkeypatch.setattr(reload_mod, "_load", no_parse)
    applied = applier.apply({config: changed})
    assert applied.mode == "restart" and restarts == [1]
    assert applied.reason == expected == "sources.bm25.k1 changed (1.2 -> 1.5): a restart-only key"
    with pytest.raises(AssertionError, match="backend's path"):  # a text not prepared is parsed then
        applier.apply({config: changed.replace("b: 0.75", "b: 0.7")})


def test_restart_keys_are_compared_in_json_and_toml_config_files() -> None:
    base_json = '{\n  "data": {"corpus": "a.jsonl"},\n  "fusion": {"method": "rrf"}\n}\n'
    base_toml = '[data]\ncorpus = "a.jsonl"  # the corpus\n\n[fusion]\nmethod = "rrf"\n'
    for path, base in ((Path("/srv/config.json"), base_json), (Path("/srv/config.toml"), base_toml)):
        fusion_only = base.replace("rrf", "linear")
        assert restart_reason({path: base}, {path: fusion_only}, ["data"]) is None
        # a comment or spacing is no change of value
        assert restart_reason({path: base}, {path: base.replace("  #", "   #").replace(": ", ":  ")}, ["data"]) is None
        moved = base.replace("a.jsonl", "b.jsonl")
        assert restart_reason({path: base}, {path: moved}, ["data"]) == (
            'data.corpus changed ("a.jsonl" -> "b.jsonl"): a restart-only key'
        )
        broken = restart_reason({path: base}, {path: base + "}}}"}, ["data"])
        assert broken is not None and broken.startswith(f"{path.name} cannot be compared for restart keys (")
