"""The HTTP config store, its restore journal and the channel's patcher, against a small
in-memory config API (httpx.MockTransport): the exact requests sent (If-Match, the
body byte for byte), a refusal quoted in one line, a read-back that differs, the
original put back byte for byte and the journal removed only once confirmed.
(The same guarantees on the real reference backend: tests/e2e/test_http_config_channel.py
and tests/faults/test_http_config_faults.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.errors import ConfigError, TargetError
from tuner.study.trial.http_channel import HTTP_TEXT, HttpConfigPatcher
from tuner.targets.http_config import HttpConfigStore, HttpJournal, first_difference

URL = "http://engine.test/admin/config"
ORIGINAL = b'{\n  "fusion": {"rrf_k": 60, "weights": {"bm25": 1.0, "dense": 1.0}},\n  "name": "prod"\n}\n'


class ConfigApi:
    """GET answers the stored bytes with an ETag of them; PUT stores the body (If-Match
    checked); ``alter`` changes what a PUT stores, ``refuse`` answers a 4xx instead."""

    def __init__(self) -> None:
        self.body = ORIGINAL
        self.requests: list[httpx.Request] = []
        self.alter: Any = None
        self.refuse: tuple[int, dict[str, Any]] | None = None

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok", "config_hash": self.etag.strip('"')})
        if request.method == "GET":
            return httpx.Response(200, content=self.body, headers={"ETag": self.etag,
                                                                   "Content-Type": "application/json"})
        if self.refuse is not None:
            status, body = self.refuse
            return httpx.Response(status, json=body)
        match = request.headers.get("If-Match")
        if match is not None and match != self.etag:
            return httpx.Response(412, json={"detail": f"If-Match {match} is not the served config's ETag"})
        doc = json.loads(request.content)
        self.body = json.dumps(self.alter(doc)).encode() if self.alter else request.content
        return httpx.Response(200, json={"ok": True}, headers={"ETag": self.etag})

    def writes(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.method in ("PUT", "POST")]


@pytest.fixture
def api() -> ConfigApi:
    return ConfigApi()


def store(api: ConfigApi, **kwargs: Any) -> HttpConfigStore:
    return HttpConfigStore(URL, headers={"Authorization": "Bearer t0ken"}, transport=httpx.MockTransport(api),
                           health_url="http://engine.test/health", **kwargs)


def patcher(api: ConfigApi, tmp_path: Path, **kwargs: Any) -> HttpConfigPatcher:
    return HttpConfigPatcher(store(api, **kwargs), HttpJournal(tmp_path / "journal.json", owner="tuner run"))


def test_a_trial_patches_only_its_values_journals_first_and_sends_if_match(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    texts = p.render({0: {"fusion.rrf_k": 20}})
    assert texts[HTTP_TEXT] == ORIGINAL.decode().replace('"rrf_k": 60', '"rrf_k": 20')  # the rest byte for byte
    etag_found = api.etag
    p.write(texts)
    put = api.writes()[0]
    assert put.method == "PUT" and put.content == texts[HTTP_TEXT].encode()
    assert put.headers["If-Match"] == etag_found and put.headers["Authorization"] == "Bearer t0ken"
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert (tmp_path / "journal.json").stat().st_mode & 0o777 == 0o600
    assert journal["url"] == URL and journal["etag"] == etag_found
    assert journal["content_type"] == "application/json" and "Authorization" not in json.dumps(journal)
    # the next write carries the ETag the last one answered
    p.write(p.render({0: {"fusion.rrf_k": 5}}))
    assert api.writes()[1].headers["If-Match"] != etag_found


def test_restore_puts_the_original_back_byte_for_byte_then_drops_the_journal(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    p.write(p.render({0: {"fusion.weights.bm25": 0.25}}))
    assert api.body != ORIGINAL
    assert p.restore() == [HTTP_TEXT]
    assert api.body == ORIGINAL and api.writes()[-1].content == ORIGINAL
    assert not (tmp_path / "journal.json").exists()


def test_the_journal_survives_the_process_and_is_replayed_at_the_next_start(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    p.write(p.render({0: {"fusion.rrf_k": 7}}))  # ... and the process is killed here
    again = HttpJournal(tmp_path / "journal.json")
    assert again.original().body == ORIGINAL
    assert again.restore(store(api)) is True
    assert api.body == ORIGINAL and not again.active


def test_a_refused_write_is_one_line_quoting_the_server_and_changes_nothing(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    api.refuse = (422, {"detail": "config not applied: PUT /admin/config: fusion.rrf_k: Input should be\n >= 0"})
    with pytest.raises(TargetError) as info:
        p.write(p.render({0: {"fusion.rrf_k": 3}}))
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"PUT {URL} refused: HTTP 422: config not applied: PUT /admin/config: fusion.rrf_k: "
                       "Input should be >= 0; the served config is unchanged")
    assert api.body == ORIGINAL


def test_a_stale_etag_is_refused_never_overwritten(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    api.body = ORIGINAL.replace(b'"prod"', b'"edited by hand"')  # someone changed it since the tuner read it
    with pytest.raises(TargetError, match=r"refused \(someone changed the config since the tuner read it\): HTTP 412"):
        p.write(p.render({0: {"fusion.rrf_k": 3}}))
    assert b"edited by hand" in api.body


def test_a_read_back_that_differs_fails_naming_the_first_difference(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    api.alter = lambda doc: {**doc, "fusion": {**doc["fusion"], "rrf_k": 60}}
    with pytest.raises(TargetError, match=r"read-back of .* differs from the document sent \(fusion\.rrf_k: sent 9, "
                                          r"served 60\); the backend does not serve what the tuner wrote"):
        p.write(p.render({0: {"fusion.rrf_k": 9}}))
    assert p.journal.active  # the original stays journaled: the end of the run puts it back


def test_a_restore_whose_read_back_differs_keeps_the_journal(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    p.write(p.render({0: {"fusion.rrf_k": 9}}))
    api.alter = lambda doc: {**doc, "name": "not the original"}
    with pytest.raises(TargetError, match=r"the read-back differs \(name: sent \"prod\", served \"not the original\"\)"
                                          r"; the journal .* is kept"):
        p.restore()
    assert p.journal.active


def test_a_journal_for_another_url_is_not_replayed(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    p.write(p.render({0: {"fusion.rrf_k": 9}}))
    other = HttpConfigStore("http://engine.test/other", transport=httpx.MockTransport(api))
    with pytest.raises(TargetError, match=r"the journal is for http://engine.test/admin/config, not "
                                          r"http://engine.test/other; put target.http.url back"):
        HttpJournal(tmp_path / "journal.json").restore(other)


def test_a_fingerprint_in_the_health_answer_can_confirm_instead(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path, read_back=False, fingerprint="config_hash")
    p.write(p.render({0: {"fusion.rrf_k": 9}}))
    assert [r.method for r in api.requests] == ["GET", "PUT", "GET"]  # the found document, the write, the health
    assert api.requests[-1].url.path == "/health"
    api.alter = lambda doc: doc  # stores a re-serialised body: a new ETag, but the health answer follows it
    p.write(p.render({0: {"fusion.rrf_k": 10}}))


def test_the_same_document_twice_is_written_once(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    texts = p.render({0: {"fusion.rrf_k": 9}})
    p.write(texts)
    p.write(texts)
    assert len(api.writes()) == 1


def test_a_path_the_document_lacks_is_a_config_error(api: ConfigApi, tmp_path: Path) -> None:
    p = patcher(api, tmp_path)
    with pytest.raises(ConfigError, match=r"fusion\.no_such"):
        p.render({0: {"fusion.no_such": 1}})


def test_an_answer_that_is_not_a_json_object_is_refused(api: ConfigApi) -> None:
    api.body = b"[1, 2]"
    with pytest.raises(TargetError, match=r"the answer is a JSON list, not an object; point target.http.url"):
        store(api).get()


def test_first_difference_names_the_path() -> None:
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == "a.b.1: sent 2, served 3"
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == "b: served, not sent"


class PipelineApi:
    """OpenSearch's search pipeline API: GET /_search/pipeline/NAME answers {NAME: {...}},
    PUT takes the {...} bare and answers {"acknowledged": true}, no ETag."""

    def __init__(self, pipeline: dict[str, Any]) -> None:
        self.pipeline = pipeline
        self.puts: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"hybrid": self.pipeline})
        assert "If-Match" not in request.headers  # no ETag was given, none is sent
        self.puts.append(request.content)
        self.pipeline = json.loads(request.content)
        return httpx.Response(200, json={"acknowledged": True})


def test_a_document_the_get_answer_wraps_is_read_patched_sent_and_restored_bare(tmp_path: Path) -> None:
    pipeline = {"description": "prod", "phase_results_processors": [{"normalization-processor": {
        "normalization": {"technique": "min_max"},
        "combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.3, 0.7]}}}}]}
    api = PipelineApi(pipeline)
    url = "http://engine.test/_search/pipeline/hybrid"
    s = HttpConfigStore(url, document="hybrid", transport=httpx.MockTransport(api))
    p = HttpConfigPatcher(s, HttpJournal(tmp_path / "journal.json"))
    key = "phase_results_processors.0.normalization-processor.combination.parameters.weights"
    assert p.documents()[0] == pipeline
    p.write(p.render({0: {key: [0.6, 0.4]}}))
    assert json.loads(api.puts[-1])["phase_results_processors"][0]["normalization-processor"]["combination"] == {
        "technique": "arithmetic_mean", "parameters": {"weights": [0.6, 0.4]}}
    assert p.restore() == [HTTP_TEXT]
    assert api.pipeline == pipeline
    missing = HttpConfigStore(url, document="other", transport=httpx.MockTransport(api))
    with pytest.raises(TargetError, match=r"the answer has no 'other' \(keys: hybrid\); fix target.http.document"):
        missing.get()


def test_every_reader_names_a_pending_journal_of_the_document(api: ConfigApi, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tuner.cli.study_common import pending_journal_line

    exp = SimpleNamespace(target=SimpleNamespace(channel="http"), http_journal_path=tmp_path / "journal.json",
                          journal_path=tmp_path / "restore-journal.json", source="exp.yaml")
    assert pending_journal_line(exp) is None
    p = patcher(api, tmp_path)
    p.write(p.render({0: {"fusion.rrf_k": 9}}))
    line = pending_journal_line(exp)
    assert line is not None and "\n" not in line
    assert line.startswith(f"restore journal pending: {tmp_path / 'journal.json'}, left by tuner run (pid ")
    assert f"the document at {URL} may hold its trial's values" in line
    assert "`tuner apply exp.yaml --recover` puts the original back" in line
