"""Config files in YAML, JSON and TOML (tuner.config.formats): each keeps what its format
can keep. Per format: an untouched file round-trips byte for byte; a patch changes only
the lines of the edited values (comments, order, indentation kept); list indices work as
path segments; an int stays an int and a float a float; a bad key is one ConfigError line
naming the file and the key. ConfigPatcher writes, journals and restores every format."""

from __future__ import annotations

import json
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tuner.config.configpatch import ConfigPatcher, unified_diff
from tuner.config.formats import check_suffix, format_for
from tuner.config.target import TargetConfig
from tuner.errors import ConfigError

YAML_TEXT = textwrap.dedent(
    """\
    # Top comment: kept.
    fusion:
      method: rrf          # rrf | linear
      rrf_k: 60            # RRF constant
      weights: {bm25: 1.0, dense: 1.0}
      label: "café"
    fallback:
      windows_days: [30, 90]   # strictly increasing
    recency:
      weight: 0.0
    """
)

JSON_TEXT = textwrap.dedent(
    """\
    {
        "fusion": {
            "method": "rrf",
            "rrf_k": 60,
            "weights": {"bm25": 1.0, "dense": 1.0},
            "label": "café"
        },
        "fallback": {
            "windows_days": [30, 90]
        },
        "recency": {
            "weight": 0.0
        }
    }
    """
)

TOML_TEXT = textwrap.dedent(
    """\
    # Top comment: kept.
    [fusion]
    method = "rrf"         # rrf | linear
    rrf_k = 60             # RRF constant
    weights = { bm25 = 1.0, dense = 1.0 }
    label = 'café'

    [fallback]
    windows_days = [30, 90]  # strictly increasing

    [recency]
    weight = 0.0
    """
)

TEXTS = {".yaml": YAML_TEXT, ".json": JSON_TEXT, ".toml": TOML_TEXT}
EDITS = {"fusion.rrf_k": 20, "fallback.windows_days.1": 120, "recency.weight": 1}
# The lines each format's patch must change (and no other)
CHANGED = {
    ".yaml": [
        ("  rrf_k: 60            # RRF constant", "  rrf_k: 20            # RRF constant"),
        # ruamel keeps a comment's column
        ("  windows_days: [30, 90]   # strictly increasing", "  windows_days: [30, 120]  # strictly increasing"),
        ("  weight: 0.0", "  weight: 1.0"),
    ],
    ".json": [
        ('        "rrf_k": 60,', '        "rrf_k": 20,'),
        ('        "windows_days": [30, 90]', '        "windows_days": [30, 120]'),
        ('        "weight": 0.0', '        "weight": 1.0'),
    ],
    ".toml": [
        ("rrf_k = 60             # RRF constant", "rrf_k = 20             # RRF constant"),
        ("windows_days = [30, 90]  # strictly increasing", "windows_days = [30, 120]  # strictly increasing"),
        ("weight = 0.0", "weight = 1.0"),
    ],
}


def parse(suffix: str, text: str) -> Any:
    """An independent parser per format (not the one under test)."""
    if suffix == ".json":
        return json.loads(text)
    if suffix == ".toml":
        return tomllib.loads(text)
    return YAML(typ="safe", pure=True).load(text)


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    diff = unified_diff(before, after, "f").splitlines()
    removed = [ln[1:] for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    return list(zip(removed, added, strict=True))


@pytest.fixture(params=sorted(TEXTS))
def suffix(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_an_untouched_file_is_written_back_byte_for_byte(suffix: str, tmp_path: Path) -> None:
    fmt = format_for(f"c{suffix}")
    text = TEXTS[suffix]
    assert fmt.patch(text, {}, "c") == text
    assert fmt.patch(text, {"fusion.rrf_k": 60, "fusion.method": "rrf"}, "c") == text  # same values: as found
    assert fmt.load(text, "c")["fusion"]["rrf_k"] == 60
    path = tmp_path / f"config{suffix}"
    path.write_text(text, encoding="utf-8")
    patcher = ConfigPatcher([path], tmp_path / "journal.json")
    assert patcher.render({0: {"fusion.rrf_k": 60}})[path] == text


def test_a_patch_changes_only_the_edited_values_lines(suffix: str) -> None:
    text = TEXTS[suffix]
    out = format_for(f"c{suffix}").patch(text, EDITS, f"c{suffix}")
    assert changed_lines(text, out) == CHANGED[suffix]
    doc = parse(suffix, out)
    assert doc["fusion"]["rrf_k"] == 20 and doc["fallback"]["windows_days"] == [30, 120]
    assert list(doc) == ["fusion", "fallback", "recency"] and list(doc["fusion"])[:2] == ["method", "rrf_k"]
    assert doc["fusion"]["label"] == "café" and "café" in out  # non-ASCII kept as written
    assert out.endswith("}\n" if suffix == ".json" else "\n")


def test_types_are_kept_int_stays_int_and_float_stays_float(suffix: str) -> None:
    fmt = format_for(f"c{suffix}")
    out = fmt.patch(TEXTS[suffix], {"fusion.rrf_k": 25.0, "fusion.weights.bm25": 2, "fusion.label": "x"}, "c")
    doc = parse(suffix, out)
    assert type(doc["fusion"]["rrf_k"]) is int and doc["fusion"]["rrf_k"] == 25
    assert type(doc["fusion"]["weights"]["bm25"]) is float and doc["fusion"]["weights"]["bm25"] == 2.0
    assert doc["fusion"]["label"] == "x"
    if suffix == ".toml":
        assert "label = 'x'" in out  # a literal string stays literal


def test_a_list_of_another_length_is_written_in_the_lists_layout(suffix: str) -> None:
    out = format_for(f"c{suffix}").patch(TEXTS[suffix], {"fallback.windows_days": [7, 30, 90]}, "c")
    assert parse(suffix, out)["fallback"]["windows_days"] == [7, 30, 90]
    assert len(changed_lines(TEXTS[suffix], out)) == 1  # still one line


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("fusion.rrf_kk", "no such key (did you mean fusion.rrf_k?)"),
        ("fusion.method.deep", "no such key"),  # the parent is a value, not a table
        ("fallback.windows_days.7", "no such key"),
        ("nothing.here", "no such key nothing"),
    ],
)
def test_a_bad_key_is_one_line_naming_the_file_and_the_key(suffix: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        format_for(f"c{suffix}").patch(TEXTS[suffix], {key: 1}, f"backend/config{suffix}")
    message = str(err.value)
    assert message.startswith(f"backend/config{suffix}: {key}: ") and expected in message
    assert "\n" not in message


def test_a_key_under_a_value_says_the_parent_is_no_table_in_json_and_toml() -> None:
    for suffix in (".json", ".toml"):
        with pytest.raises(ConfigError, match=r"fusion\.method is a (string|value), not"):
            format_for(f"c{suffix}").patch(TEXTS[suffix], {"fusion.method.deep": 1}, f"c{suffix}")


@pytest.mark.parametrize(
    ("indent", "text"),
    [
        ("2 spaces", '{\n  "a": {\n    "b": [\n      1\n    ],\n    "c": 1\n  }\n}\n'),
        ("tabs", '{\n\t"a": {\n\t\t"b": [\n\t\t\t1\n\t\t],\n\t\t"c": 1\n\t}\n}'),
        ("one line", '{"a": {"b": [1], "c": 1}}'),
        ("compact", '{"a":{"b":[1],"c":1}}\n'),
    ],
)
def test_json_keeps_the_files_indentation(indent: str, text: str) -> None:
    fmt = format_for("c.json")
    out = fmt.patch(text, {"a.b": [1, 2], "a.c": 2}, "c.json")
    assert json.loads(out) == {"a": {"b": [1, 2], "c": 2}}
    expected = json.loads(text)
    if indent == "one line":
        assert out == '{"a": {"b": [1, 2], "c": 2}}'
    elif indent == "compact":
        assert out == '{"a":{"b":[1,2],"c":2}}\n'
    else:
        unit = "\t" if indent == "tabs" else "  "
        tail = text[len(json.dumps(expected, indent=unit)) :]  # the trailing newline, or none
        assert out == json.dumps({"a": {"b": [1, 2], "c": 2}}, indent=unit) + tail


def test_json_keeps_escapes_when_the_file_is_ascii_only() -> None:
    text = '{"label": "caf\\u00e9", "other": "x"}\n'
    out = format_for("c.json").patch(text, {"other": "naïve"}, "c.json")
    assert out == '{"label": "caf\\u00e9", "other": "na\\u00efve"}\n'


def test_json_refuses_nan_and_toml_refuses_null() -> None:
    with pytest.raises(ConfigError, match=r"^c\.json: recency\.weight: nan cannot be written to JSON"):
        format_for("c.json").patch(JSON_TEXT, {"recency.weight": float("nan")}, "c.json")
    with pytest.raises(ConfigError, match=r"^c\.toml: recency\.weight: TOML has no null"):
        format_for("c.toml").patch(TOML_TEXT, {"recency.weight": None}, "c.toml")


def test_toml_patches_arrays_of_tables_by_index() -> None:
    text = '[[servers]]\nport = 1  # first\n\n[[servers]]\nport = 2\n'
    out = format_for("c.toml").patch(text, {"servers.1.port": 3}, "c.toml")
    assert out == '[[servers]]\nport = 1  # first\n\n[[servers]]\nport = 3\n'


def test_an_invalid_file_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^c\.json:2: invalid JSON: "):
        format_for("c.json").load('{\n  "a": }\n', "c.json")
    with pytest.raises(ConfigError, match=r"^c\.toml: invalid TOML: "):
        format_for("c.toml").load("a = = 1\n", "c.toml")
    with pytest.raises(ConfigError, match=r"^c\.json: expected an object at the top level"):
        format_for("c.json").load("[1, 2]\n", "c.json")


def test_an_unknown_suffix_is_refused_naming_the_supported_ones(tmp_path: Path) -> None:
    assert check_suffix("a.YML") is None and check_suffix("b.json") is None and check_suffix("c.toml") is None
    with pytest.raises(ConfigError, match=r"^config\.ini: suffix '\.ini': .*\(\.yaml, \.yml, \.json, \.toml\)"):
        format_for("backend/config.ini")
    with pytest.raises(ValueError, match=r"config\.ini: suffix '\.ini'.*\.yaml, \.yml, \.json, \.toml"):
        TargetConfig.model_validate({"config_files": ["config.ini"], "apply": "none", "health": {"url": "http://x"}})


def test_the_patcher_writes_journals_and_restores_every_format(tmp_path: Path) -> None:
    files = []
    for suffix, text in TEXTS.items():
        path = tmp_path / f"config{suffix}"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o640)
        files.append(path)
    patcher = ConfigPatcher(files, tmp_path / "state" / "journal.json")
    docs = patcher.documents()
    assert [d["fusion"]["rrf_k"] for d in docs] == [60, 60, 60]
    diff = patcher.diff({i: EDITS for i in range(3)})
    # apply --dry-run's diff: the three edited lines of each file, nothing else
    assert sum(ln.startswith("+") and not ln.startswith("+++") for ln in diff.splitlines()) == 9
    assert all(f"+++ b/{p.name}" in diff or f"+++ b/{p}" in diff for p in files)
    patcher.apply({i: EDITS for i in range(3)})
    for path in files:
        assert parse(path.suffix, path.read_text(encoding="utf-8"))["fusion"]["rrf_k"] == 20
        assert path.stat().st_mode & 0o777 == 0o640
    # the next render starts from the journaled originals, not from what the last one wrote
    assert all(d["fusion"]["rrf_k"] == 60 for d in patcher.documents())
    patcher.restore()
    assert [p.read_text(encoding="utf-8") for p in files] == list(TEXTS.values())


def test_crlf_files_stay_crlf_in_json_and_toml() -> None:
    text = '{\r\n  "a": [\r\n    1\r\n  ],\r\n  "b": 1\r\n}\r\n'
    assert format_for("c.json").patch(text, {"a": [1, 2], "b": 2}, "c.json") == (
        '{\r\n  "a": [\r\n    1,\r\n    2\r\n  ],\r\n  "b": 2\r\n}\r\n'
    )
    text = "[a]\r\nb = 1  # c\r\n"
    assert format_for("c.toml").patch(text, {"a.b": 2}, "c.toml") == "[a]\r\nb = 2  # c\r\n"
