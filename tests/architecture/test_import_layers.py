"""The package reads top-down: no import cycle anywhere, and imports only point down the layers
drawn in docs/DESIGN.md. Built from the source, so a future cycle fails with the modules named."""

from __future__ import annotations

from pathlib import Path

import pytest

from architecture.imports import cycle_path, cycles, import_graph, layer_of, module_files, upward_imports

REPO = Path(__file__).resolve().parents[2]

# docs/DESIGN.md "Import layers": a module may import its own layer's modules (no cycle)
# and any lower layer's; never a higher one.
LAYERS = {
    "tuner.errors": 0,
    "tuner.files": 0,
    "tuner.dburl": 0,
    "tuner.secrets": 0,
    "tuner.threads": 0,
    "tuner.diskspace": 0,
    "tuner.pids": 0,
    "tuner.ports": 0,
    "tuner.tls": 0,
    "tuner.optuna_adapter": 0,
    "tuner.numbers": 0,
    "tuner.held": 0,
    "tuner.metrics": 1,
    "tuner.data": 2,
    "tuner.evaluation": 3,
    "tuner.config": 4,
    "tuner.report": 5,
    "tuner.targets": 6,
    "tuner.study": 7,
    "tuner.ops": 8,
    "tuner.cli": 9,
    "tuner.__main__": 9,
    "tuner": 9,  # tuner/__init__.py: the version only
}


def test_no_import_cycle_in_tuner_or_backend():
    graph = import_graph(module_files(REPO, ["tuner", "backend/fusion_backend"]))
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle_path(graph, c)) for c in found)


def test_every_tuner_module_has_a_layer():
    mods = module_files(REPO, ["tuner"])
    assert [m for m in mods if layer_of(m, LAYERS) is None] == []


def test_imports_only_point_down():
    graph = import_graph(module_files(REPO, ["tuner"]))
    bad = upward_imports(graph, LAYERS)
    assert not bad, "imports pointing up a layer: " + ", ".join(
        f"{a} ({layer_of(a, LAYERS)}) -> {b} ({layer_of(b, LAYERS)})" for a, b in bad
    )


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("style", ["top-level", "lazy in a function", "relative", "TYPE_CHECKING"])
def test_a_planted_cycle_is_found_and_named(tmp_path, style):
    back = {
        "top-level": "from pkg.a import x\n",
        "lazy in a function": "def f():\n    from pkg.a import x\n    return x\n",
        "relative": "from ..a import x\n",
        "TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n",
    }[style]
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/a.py", "from pkg.sub.b import y\nx = 1\n")
    _write(tmp_path, "pkg/sub/__init__.py", "")
    _write(tmp_path, "pkg/sub/b.py", back + "y = 2\n")
    _write(tmp_path, "pkg/c.py", "import pkg.a\n")
    graph = import_graph(module_files(tmp_path, ["pkg"]))
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.b"]]
    assert cycle_path(graph, found[0]) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_no_cycle_when_imports_only_point_down(tmp_path):
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/low.py", "x = 1\n")
    _write(tmp_path, "pkg/high.py", "from pkg.low import x\nfrom pkg import low\n")
    graph = import_graph(module_files(tmp_path, ["pkg"]))
    assert graph["pkg.high"] == {"pkg.low"}
    assert cycles(graph) == []


def test_an_upward_import_is_named(tmp_path):
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/data/__init__.py", "")
    _write(tmp_path, "pkg/data/rows.py", "from pkg.cli.main import run\n")
    _write(tmp_path, "pkg/cli/__init__.py", "")
    _write(tmp_path, "pkg/cli/main.py", "from pkg.data.rows import run\n")
    graph = import_graph(module_files(tmp_path, ["pkg"]))
    bad = upward_imports(graph, {"pkg.data": 1, "pkg.cli": 2})
    assert bad == [("pkg.data.rows", "pkg.cli.main")]


def test_design_md_names_every_module_and_layer_folder():
    design = (REPO / "docs" / "DESIGN.md").read_text()
    modules = [p for p in (REPO / "tuner").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert [str(p.relative_to(REPO)) for p in modules if f"`{p.name}`" not in design] == []
    folders = {name.split(".")[1] for name in LAYERS if name.count(".") == 1 and (REPO / name.replace(".", "/")).is_dir()}
    assert [f for f in sorted(folders) if f"`tuner/{f}/`" not in design] == []
