"""``${ENV}`` in typed YAML files (tuner.config.yamlfile.load_model): expansion, defaults, the
one-line error of an unset variable, and secrets remembered for scrubbing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from tuner import secrets
from tuner.config.yamlfile import load_model
from tuner.errors import ConfigError


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    headers: dict[str, str] = {}
    port: int = 0


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request: Request
    notes: list[str] = []


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_variables_defaults_and_literals(tmp_path: Path) -> None:
    path = write(tmp_path, (
        "request:\n"
        "  url: http://${HOST}:${PORT:-8080}/search\n"
        "  headers: {Authorization: 'Bearer ${TOKEN}'}\n"
        "  port: ${PORT:-9000}\n"
        "notes: ['$${NOT_A_VAR}', '${EMPTY:-fallback}', 'plain {query}']\n"))
    doc = load_model(path, Doc, environ={"HOST": "h1", "TOKEN": "tkn-0123456789", "EMPTY": ""})
    assert doc.request.url == "http://h1:8080/search"
    assert doc.request.headers == {"Authorization": "Bearer tkn-0123456789"}
    assert doc.request.port == 9000
    assert doc.notes == ["${NOT_A_VAR}", "fallback", "plain {query}"]


def test_an_unset_variable_is_one_line_naming_it_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "request:\n  url: http://h/s\n  headers:\n    X-Api-Key: ${SEARCH_API_KEY}\n")
    with pytest.raises(ConfigError) as err:
        load_model(path, Doc, environ={})
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith("exp.yaml:4: request.headers.X-Api-Key: environment variable SEARCH_API_KEY is not set "
                            "(export it, or write ${SEARCH_API_KEY:-default})")


def test_a_malformed_reference_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "request:\n  url: http://h/${not valid}\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml:2: request\.url: \$\{not valid\} is not a variable reference"):
        load_model(path, Doc, environ={})


def test_expanded_secrets_are_remembered_for_scrubbing(tmp_path: Path) -> None:
    path = write(tmp_path, (
        "request:\n"
        "  url: http://h/s?sig=${SIGNING_TOKEN}\n"
        "  headers: {Authorization: 'Bearer ${BEARER}'}\n"
        "notes: ['${HOSTNAME_LIKE}']\n"))
    load_model(path, Doc, environ={"SIGNING_TOKEN": "sig-abcdef123456", "BEARER": "bearer-0123456789",
                                   "HOSTNAME_LIKE": "search.internal.example"})
    scrubbed = secrets.scrub_known("sig-abcdef123456 bearer-0123456789 search.internal.example")
    # by the variable's name, by the header's name; an ordinary value stays
    assert scrubbed == "*** *** search.internal.example"
    assert secrets.env_name_of("bearer-0123456789") == "BEARER"


def test_a_literal_secret_in_a_file_is_remembered_too(tmp_path: Path) -> None:
    path = write(tmp_path, "request:\n  url: http://h/s\n  headers: {X-Api-Key: literal-key-0042}\n")
    load_model(path, Doc, environ={})
    assert secrets.scrub_known("echo literal-key-0042") == "echo ***"


def test_experiment_files_expand_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from support.reference_experiment import write_reference_experiment

    from tuner.config.experiment import load_experiment

    monkeypatch.setenv("TUNER_TEST_BEARER", "bearer-for-experiment-1")
    path = write_reference_experiment(
        tmp_path, study="env", n_trials=1,
        evaluation={"request": {"headers": {"Authorization": "Bearer ${TUNER_TEST_BEARER}"}}})
    exp = load_experiment(path, check_paths=False)
    assert exp.evaluation.request.headers == {"Authorization": "Bearer bearer-for-experiment-1"}
    monkeypatch.delenv("TUNER_TEST_BEARER")
    with pytest.raises(ConfigError, match=r"experiment\.yaml:\d+: evaluation\.request\.headers\.Authorization: "
                                          r"environment variable TUNER_TEST_BEARER is not set"):
        load_experiment(path, check_paths=False)
