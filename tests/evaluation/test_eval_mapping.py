import json

import pytest

from tuner.data.dataset import Query
from tuner.errors import ConfigError, ResponseMappingError
from tuner.evaluation.mapping import (
    Hit,
    build_body,
    decode_json,
    parse_response,
    prepare_request,
    resolve_path,
)
from tuner.evaluation.spec import EvalSpec, RequestMapping, ResponseMapping

Q = Query("q7", "rrf constant", "short", "faq", "in", "dev", {"date_hint_days": 30, "filters": {"lang": "en"}})


def test_exact_placeholders_keep_their_type_and_strings_format():
    mapping = RequestMapping(url="http://x", body={
        "q": "{query}", "k": "{top_k}", "days": "{date_hint_days}", "label": "id={query_id}/{query_type}",
        "nested": {"list": ["{top_k}", "{split}", 5]}, "literal": "{{not a field}}",
    }, pass_extra=False)
    body = build_body(mapping, Q, top_k=25)
    assert body == {
        "q": "rrf constant", "k": 25, "days": 30, "label": "id=q7/short",
        "nested": {"list": [25, "dev", 5]}, "literal": "{not a field}",
    }
    assert isinstance(body["k"], int)


def test_extra_fields_merge_over_template_defaults_when_pass_extra():
    mapping = RequestMapping(url="http://x", body={"query": "{query}", "top_k": "{top_k}", "filters": {}})
    assert build_body(mapping, Q, 10) == {"query": "rrf constant", "top_k": 10, "date_hint_days": 30,
                                          "filters": {"lang": "en"}}
    off = mapping.model_copy(update={"pass_extra": False})
    assert build_body(off, Q, 10) == {"query": "rrf constant", "top_k": 10, "filters": {}}


@pytest.mark.parametrize("template", ["{missing}", "x {missing} y"])
def test_unknown_template_name_is_a_config_error_naming_query(template):
    mapping = RequestMapping(url="http://x", body={"a": {"b": template}})
    with pytest.raises(ConfigError, match=r"request\.body\.a\.b: .*\{missing\}.*query q7"):
        build_body(mapping, Q, 10)


@pytest.mark.parametrize(("body", "where", "what"), [
    ({"a": [1, {"b": ["x", "{missing}"]}]}, "request.body.a[1].b[1]", r"\{missing\}.*query q7"),
    ({"a": {"n": 3, "s": "lone } brace"}}, "request.body.a.s", "bad template"),
    ({"a": [{"deep": [[None, "{nope:x}"]]}]}, "request.body.a[0].deep[0][1]", r"\{nope\}"),
])
def test_a_template_error_names_the_path_through_dicts_and_lists(body, where, what):
    # the filler skips what has nothing to fill (numbers, null, strings without braces) and
    # spells the path only for an error: the path must still be the one to fix
    mapping = RequestMapping(url="http://x", body=body)
    with pytest.raises(ConfigError) as err:
        build_body(mapping, Q, 10)
    assert str(err.value).startswith(where + ": ")
    assert __import__("re").search(what, str(err.value))


def test_parts_with_nothing_to_fill_come_out_equal():
    body = {"o": {"f": {"m": "rrf", "k": 60, "w": {"a": 1.5, "b": True}, "n": None}, "l": [30, 90, "x"]},
            "t": "{top_k}", "tail": "a}}b{{c"}
    mapping = RequestMapping(url="http://x", body=body, pass_extra=False)
    assert build_body(mapping, Q, 10) == {**body, "t": 10, "tail": "a}b{c"}


def test_prepare_request_sets_request_id_header_and_get_params():
    spec = EvalSpec(request=RequestMapping(url="http://x/s", headers={"Authorization": "k"}), top_k=5)
    req = prepare_request(spec, Q, "rid-1")
    assert req.headers == {"Authorization": "k", "X-Request-ID": "rid-1"}
    assert req.json == {"query": "rrf constant", "top_k": 5, "date_hint_days": 30, "filters": {"lang": "en"}}
    get = EvalSpec(request=RequestMapping(url="http://x/s", method="GET", request_id_header="X-Trace"))
    req = prepare_request(get, Q, "rid-2")
    assert req.json is None and req.headers == {"X-Trace": "rid-2"}
    assert req.params == {"query": "rrf constant", "top_k": 50, "date_hint_days": 30, "filters": '{"lang": "en"}'}


def test_parse_response_dotted_paths():
    payload = {"data": {"hits": [
        {"doc": {"id": 12}, "s": 0.5, "meta": {"title": "A"}},
        {"doc": {"id": "b"}, "s": 1, "meta": {}},
    ]}, "signals": [{"conf": 0.71, "handoff": False, "level": 2}]}
    mapping = ResponseMapping(results_path="data.hits", doc_id="doc.id", score="s", title="meta.title",
                              confidence="signals.0.conf", handoff="signals.0.handoff", fallback_level="signals.0.level")
    parsed = parse_response(payload, mapping, "q1")
    assert parsed.hits == (Hit("12", 0.5, "A"), Hit("b", 1.0, None))
    assert (parsed.confidence, parsed.handoff, parsed.fallback_level) == (0.71, False, "2")


def test_optional_signals_absent_are_none_and_null_results_are_empty():
    mapping = ResponseMapping(confidence="confidence", handoff="handoff", fallback_level="fallback_level")
    parsed = parse_response({"results": None}, mapping, "q1")
    assert parsed.hits == () and parsed.confidence is None and parsed.handoff is None


def test_resolve_path_on_lists_and_scalars():
    from tuner.evaluation.mapping import _MISSING

    assert resolve_path({"a": [1, {"b": 2}]}, "a.1.b") == 2
    assert resolve_path({"a": [1]}, "a.-1") == 1
    assert resolve_path({"a": [1]}, "a.3") is _MISSING
    assert resolve_path({"a": 1}, "a.b") is _MISSING


def test_a_score_sent_as_text_is_read_as_its_number():
    # Weaviate's GraphQL answers _additional.score as text
    parsed = parse_response({"results": [{"doc_id": "a", "score": "0.016393442"}, {"doc_id": "b", "score": 2}]},
                            ResponseMapping(), "q1")
    assert [h.score for h in parsed.hits] == [0.016393442, 2.0]


@pytest.mark.parametrize(
    ("payload", "mapping", "expected"),
    [
        ({"hits": []}, ResponseMapping(), r"query q9: response has no 'results' \(top-level keys: hits\); set response\.results_path"),
        ({"results": {"a": 1}}, ResponseMapping(), r"query q9: 'results' is a dict, not a list"),
        ({"results": [{"id": "x"}]}, ResponseMapping(), r"query q9: results\[0\] has no usable 'doc_id'"),
        ({"results": [{"doc_id": "x", "score": "high"}]}, ResponseMapping(), r"query q9: results\[0\]\.score = 'high' is not a finite number"),
        ({"results": [{"doc_id": "x", "score": "nan"}]}, ResponseMapping(), r"query q9: results\[0\]\.score = nan is not a finite number"),
        ({"results": [], "handoff": "maybe"}, ResponseMapping(handoff="handoff"), r"query q9: response\.handoff = 'maybe' is not a boolean"),
        ([1, 2], ResponseMapping(), r"query q9: response has no 'results' \(top-level keys: list\)"),
    ],
)
def test_response_mapping_errors_name_query_and_path(payload, mapping, expected):
    with pytest.raises(ResponseMappingError, match=expected):
        parse_response(payload, mapping, "q9")


def test_non_json_body_names_the_query():
    with pytest.raises(ResponseMappingError, match=r"query q3: response is not JSON \(text/html\): '<html>"):
        decode_json(b"<html>oops</html>", "q3", "text/html")
    assert decode_json(json.dumps({"a": 1}).encode(), "q3") == {"a": 1}


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_request_templates_send_what_prepare_request_builds_with_fresh_ids(method):
    """A study's requests are built once (tuner.evaluation.mapping.RequestTemplates):
    each batch sends the same method, URL, params, headers and body bytes as building
    them anew, with a new request id per query and batch."""
    from tuner.evaluation.client import _encode
    from tuner.evaluation.mapping import RequestTemplates

    spec = EvalSpec(request=RequestMapping(url="http://svc/search", method=method, pass_extra=True,
                                           headers={"Authorization": "Bearer t"},
                                           body={"q": "{query}", "k": "{top_k}", "type": "{query_type}"}))
    queries = [Q, Query("q8", "big int", "long", "faq", "in", "dev", {"seed": 2**70})]  # past orjson's ints
    templates = RequestTemplates(spec, queries)
    first, second = templates.for_batch(queries), templates.for_batch(queries[::-1])
    ids = [r.request_id for r in first + second]
    assert len(set(ids)) == 4 and all(ids)
    for sent in first + second:
        fresh = prepare_request(spec, next(q for q in queries if q.query_id == sent.query_id), sent.request_id)
        assert (sent.method, sent.url, sent.params, sent.json) == (fresh.method, fresh.url, fresh.params, fresh.json)
        assert _encode(sent) == _encode(fresh)
        assert sent.headers[spec.request.request_id_header] == sent.request_id
