"""tuner.secrets: which names are secret, and what redaction leaves of URLs, free text,
mappings and an evaluation spec."""

from __future__ import annotations

import json

import pytest

from tuner import secrets
from tuner.secrets import REDACTED, is_secret_name, redact_mapping, redact_spec, redact_text, redact_url

TOKEN = "tok-5f0c1e9a7b3d4c2e"


@pytest.mark.parametrize("name", [
    "Authorization", "authorization", "Proxy-Authorization", "Cookie", "Set-Cookie",
    "X-Api-Key", "x_api_key", "apikey", "apiKey", "Ocp-Apim-Subscription-Key", "key",
    "access_token", "accessToken", "X-Auth-Token", "refresh-token", "token",
    "client_secret", "clientSecret", "secrets", "password", "db_password", "PASSWD", "pwd",
    "credentials", "x-auth",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "keywords", "max_tokens", "tokenizer", "author", "query", "top_k", "request_id_header", "X-Request-ID",
    "query_id", "date_from", "secret_fields", "Content-Type", "restart_keys",
])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_extra_names_are_matched_in_any_spelling() -> None:
    assert is_secret_name("X-Tenant-Sig", ["x_tenant_sig"])
    assert is_secret_name("tenantSig", ["tenant-sig"])
    assert not is_secret_name("tenant", ["tenant-sig"])


def test_redact_url_hides_the_password_and_secret_query_parameters_only() -> None:
    url = "https://svc:hunter2pw@search.internal:8443/v1/search?q=x&api_key=abc&access_token=t0k&top=5#frag"
    assert redact_url(url) == "https://svc:***@search.internal:8443/v1/search?q=x&api_key=***&access_token=***&top=5#frag"
    assert redact_url("http://127.0.0.1:8000/search") == "http://127.0.0.1:8000/search"
    assert redact_url("http://h/s?sig=abc", ["sig"]) == "http://h/s?sig=***"


def test_redact_url_on_storage_dsns() -> None:
    assert redact_url("postgresql://tuner:pw@127.0.0.1:5432/db") == "postgresql://tuner:***@127.0.0.1:5432/db"
    assert redact_url("postgresql+psycopg2://tuner@127.0.0.1/db") == "postgresql+psycopg2://tuner@127.0.0.1/db"
    assert redact_url("sqlite:////tmp/optuna.db") == "sqlite:////tmp/optuna.db"


def test_redact_text_finds_urls_auth_schemes_and_assignments() -> None:
    text = ("Client error '401 Unauthorized' for url 'http://h:1/search?q=a&api_key=zz9&n=3'; "
            "storage postgresql://u:pw@db/x; Authorization: Bearer abcdefgh12345; token=qq password: hunter2; "
            "response mapping key: doc_id; keywords=a")
    assert redact_text(text) == (
        "Client error '401 Unauthorized' for url 'http://h:1/search?q=a&api_key=***&n=3'; "
        "storage postgresql://u:***@db/x; Authorization: ***; token=*** password: ***; "
        "response mapping key: doc_id; keywords=a")
    assert redact_text("Bearer abcdefgh12345 was refused") == "Bearer *** was refused"


def test_redact_mapping_is_recursive_and_keeps_the_keys() -> None:
    data = {"headers": {"Authorization": "Bearer x", "Accept": "application/json"},
            "body": {"query": "{query}", "auth": {"password": "p", "user": "u"}, "list": [{"api_key": "k"}, "plain"]},
            "url": "http://h/s?token=t", "n": 3}
    assert redact_mapping(data) == {
        "headers": {"Authorization": REDACTED, "Accept": "application/json"},
        "body": {"query": "{query}", "auth": REDACTED, "list": [{"api_key": REDACTED}, "plain"]},
        "url": "http://h/s?token=***", "n": 3}
    assert data["headers"]["Authorization"] == "Bearer x"  # a copy, not in place


def test_redact_spec_uses_the_spec_s_own_secret_fields() -> None:
    spec = {"request": {"url": "http://h/search?tenant_sig=s1&q=1", "method": "POST",
                        "headers": {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "k", "X-Request-ID": "r"},
                        "body": {"query": "{query}", "tenant_sig": "s2", "top_k": "{top_k}"},
                        "secret_fields": ["tenant_sig"]},
            "top_k": 20}
    out = redact_spec(spec)
    assert out["request"]["headers"] == {"Authorization": REDACTED, "X-Api-Key": REDACTED, "X-Request-ID": "r"}
    assert out["request"]["body"] == {"query": "{query}", "tenant_sig": REDACTED, "top_k": "{top_k}"}
    assert out["request"]["url"] == "http://h/search?tenant_sig=***&q=1"
    assert out["request"]["secret_fields"] == ["tenant_sig"]
    assert TOKEN not in json.dumps(out)


def test_secret_fields_read_from_models_and_dicts() -> None:
    from tuner.evaluation.spec import EvalSpec

    spec = EvalSpec.model_validate({"request": {"url": "http://h/s"}})
    assert secrets.secret_fields(spec) == ()  # until RequestMapping has the field, and without it after
    assert secrets.secret_fields({"request": {"secret_fields": ["a"]}}) == ("a",)
    assert secrets.secret_fields({"secret_fields": ["b"]}) == ("b",)


def test_remembered_values_are_scrubbed_in_every_form() -> None:
    secrets.remember(f"Bearer {TOKEN}", "short")
    assert secrets.scrub_known(f"echo: {TOKEN}!") == "echo: ***!"
    assert secrets.scrub_known(f"h: Bearer {TOKEN}") == "h: ***"
    assert secrets.scrub_known("short stays") == "short stays"  # below MIN_KNOWN_LENGTH
    quoted = 'pa"ss\\word-123'
    secrets.remember(quoted)
    assert secrets.scrub_known(json.dumps({"v": quoted})) == '{"v": "***"}'
    assert secrets.scrub_known("u?pw=pa%22ss%5Cword-123") == "u?pw=***"
    secrets.forget_all()
    assert secrets.scrub_known(TOKEN) == TOKEN


def test_remember_config_finds_secret_places_in_a_document() -> None:
    doc = {"evaluation": {"request": {
        "url": "http://h/s?access_token=querytoken123&q=1",
        "headers": {"X-Api-Key": "headerkey12345", "Accept": "application/json-ish"},
        "body": {"tenant": "bodysecret999"},
        "secret_fields": ["tenant"]}},
        "target": {"process": {"env": {"SEARCH_PASSWORD": "envpassword77"}}}}
    secrets.remember_config(doc)
    text = "querytoken123 headerkey12345 bodysecret999 envpassword77 application/json-ish"
    assert secrets.scrub_known(text) == "*** *** *** *** application/json-ish"


@pytest.mark.parametrize("text", [
    "OOS early stop: 5 of 44 OOS queries answered, the constraint OOS_FP_Rate <= 0.1 allows 4",
    "a basic settings error in fusion.weights: expected a mapping",
    "response mapping key: doc_id not found in results[0]",
    "keywords=a&max_tokens=256",
    "sqlite:////tmp/state/optuna.db",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_restart_keys_are_config_keys_not_secrets() -> None:
    # the reload section's restart_keys were remembered as secrets and scrubbed from the
    # run's start line ("restarts it (***, data)")
    from tuner.secrets import forget_all, remember_config

    forget_all()
    try:
        remember_config({"target": {"reload": {"restart_keys": ["sources.*.embedder", "data"]},
                                    "health": {"headers": {"api-key": "s3cret-value-123"}}}})
        line = redact_text("an index setting (sources.*.embedder, data) restarts it; key s3cret-value-123")
    finally:
        forget_all()
    assert "sources.*.embedder" in line and "s3cret-value-123" not in line
