"""``target.channel: http`` in an experiment file: the section is read, ``{port}`` filled,
and every contradiction refused at load in one line that says the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.config.experiment import load_experiment
from tuner.errors import ConfigError

HTTP = """\
study: s1
n_trials: 5
dataset:
  queries: queries.jsonl
target:
  channel: http
  apply: none
  port: 9311
  http:
    url: "http://127.0.0.1:{port}/admin/config"
    headers: {Authorization: "Bearer s3cret"}
%s
  health: {url: "http://127.0.0.1:{port}/health"}
evaluation:
  request: {url: "http://127.0.0.1:{port}/search"}
search_space: space.yaml
"""


def write(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "queries.jsonl").write_text('{"query_id": "q1", "query": "x"}\n')
    (tmp_path / "space.yaml").write_text("params:\n  fusion.rrf_k: {type: int, low: 1, high: 100}\n")
    path = tmp_path / "exp.yaml"
    path.write_text(HTTP % extra)
    return path


def test_the_section_is_read_with_its_defaults_and_the_port_filled(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path)).bind_port()
    http = exp.target.http
    assert http is not None and exp.target.channel == "http"
    assert http.url == "http://127.0.0.1:9311/admin/config"
    assert (http.method, http.read_back, http.fingerprint) == ("PUT", True, None)
    assert exp.target.config_urls == [http.url]
    assert exp.http_journal_path == exp.state_dir / "restore-journal-http.json"


@pytest.mark.parametrize(("extra", "message"), [
    ("  reload: {signal: SIGHUP, fingerprint: config_fingerprint}",
     r"channel: http writes the config through its API, which serves it; remove target.reload"),
    ("  config_files: [config.yaml]", r"channel: http patches the document at http.url, not files; remove config_files"),
    ("    read_back: false", r"a write must be confirmed: keep read_back: true, or give fingerprint"),
    ("    method: PATCH", r"http.method"),
    ("  process: {command: [x]}", r"the engine must already run: set apply: none"),
])
def test_contradictions_are_refused_at_load_in_one_line(tmp_path: Path, extra: str, message: str) -> None:
    if extra.startswith("  config_files"):
        (tmp_path / "config.yaml").write_text("a: 1\n")
    path = write(tmp_path, extra)
    if extra.startswith("  process"):
        path.write_text(path.read_text().replace("apply: none", "apply: process"))
    with pytest.raises(ConfigError, match=message) as info:
        load_experiment(path)
    assert "\n" not in str(info.value)


def test_channel_http_without_the_section_names_what_to_add(tmp_path: Path) -> None:
    path = write(tmp_path)
    text = path.read_text().replace('  http:\n    url: "http://127.0.0.1:{port}/admin/config"\n'
                                    '    headers: {Authorization: "Bearer s3cret"}\n', "")
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"channel: http needs an http: section with the config document's url"):
        load_experiment(path)


def test_the_section_without_the_channel_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "config.yaml").write_text("a: 1\n")
    path.write_text(path.read_text().replace("  channel: http\n", "  config_files: [config.yaml]\n"))
    with pytest.raises(ConfigError, match=r"http: is read with channel: http only"):
        load_experiment(path)


def test_a_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace('url: "http://127.0.0.1:{port}/admin/config"', "url: /admin/config"))
    with pytest.raises(ConfigError, match=r"is not an http\(s\) URL"):
        load_experiment(path)


def test_the_run_says_how_trials_reach_the_backend(tmp_path: Path) -> None:
    from tuner.study.wiring import apply_mode_line

    exp = load_experiment(write(tmp_path)).bind_port()
    assert apply_mode_line(exp.target) == (
        "trials write their config document (PUT http://127.0.0.1:9311/admin/config), confirmed by read back; "
        "the backend is not restarted")
