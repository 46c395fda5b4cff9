"""Reports (tuner.report) record how a batch was run, never its credentials: the spec's
secret headers, body fields and query parameters, and any remembered secret that turns
up in free text, are ``***`` in the JSON, the Markdown and the CSV."""

from __future__ import annotations

import json
from pathlib import Path

from tuner import secrets
from tuner.data.dataset import Query, QuerySet
from tuner.evaluation import FailedQuery, QueryResponse, evaluate_responses
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.report import ReportContext, write_reports

TOKEN = "tok-c0ffee-5ecret-0001"
KEY = "key-c0ffee-5ecret-0002"
QS = "qs-c0ffee-5ecret-0003"
BODY = "body-c0ffee-5ecret-0004"


def batch(echo: str) -> object:
    """One answered query whose hit title echoes ``echo`` and one failed query whose reason
    quotes a URL with a secret parameter."""
    qs = QuerySet("red", "h1", (Query("a", "alpha", "short", "faq", "in"), Query("b", "beta", "short", "faq", "in")))
    hits = (Hit("d1", 1.0, f"title {echo}"),)
    responses = [QueryResponse("a", "rid-a", ParsedResponse(hits, None, False, "0"), 5.0, 1)]
    failed = [FailedQuery("b", "rid-b", f"HTTP 401 for url 'http://h/search?access_token={QS}'", 1)]
    return evaluate_responses(qs, {"a": {"d1": 3}}, responses, failed)


def spec() -> dict:
    return {"request": {"url": f"http://u:pw-7777@h/search?access_token={QS}", "method": "POST",
                        "headers": {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": KEY, "Accept": "json"},
                        "body": {"query": "{query}", "client_secret": BODY}},
            "top_k": 10}


def test_no_secret_in_any_report_file(tmp_path: Path) -> None:
    secrets.remember_config(spec())  # what tuner.config.yamlfile does when it loads the experiment
    ctx = ReportContext(url=spec()["request"]["url"], spec=spec(),
                        extra={"trial": 3, "note": f"backend said Bearer {TOKEN}", "assignment": {"rerank.key_boost": 0.5}})
    paths = write_reports(batch(echo=KEY), tmp_path, context=ctx, config_snapshot=f"api_key: {KEY}\n")
    texts = {p.name: p.read_text() for p in (paths.json, paths.markdown, paths.per_query_csv)}
    for name, text in texts.items():
        for planted in (TOKEN, KEY, QS, BODY, "pw-7777"):
            assert planted not in text, f"{planted} in {name}"
    context = json.loads(texts["report.json"])["context"]
    assert context["spec"]["request"]["headers"] == {"Authorization": "***", "X-Api-Key": "***", "Accept": "json"}
    assert context["spec"]["request"]["body"] == {"query": "{query}", "client_secret": "***"}
    assert context["url"] == "http://u:***@h/search?access_token=***"
    assert context["assignment"] == {"rerank.key_boost": 0.5}  # tuned parameters keep their values


def test_without_secrets_the_report_is_unchanged(tmp_path: Path) -> None:
    plain = {"request": {"url": "http://h/search", "headers": {"Accept": "json"}}, "top_k": 10}
    ctx = ReportContext(url="http://h/search?q=1", spec=plain, extra={"trial": 1})
    paths = write_reports(batch(echo="x"), tmp_path, context=ctx)
    context = json.loads(paths.json.read_text())["context"]
    assert (context["url"], context["spec"], context["trial"]) == ("http://h/search?q=1", plain, 1)
