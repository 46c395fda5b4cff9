"""The import graph of a package tree, read from the source (no import is executed).

Every ``import`` / ``from ... import`` counts, including those inside functions and
under ``TYPE_CHECKING``: a lazy import hides a cycle from the interpreter, not from a
reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """``{dotted module name: file}`` for every .py file under each package dir (relative to ``root``)."""
    mods: dict[str, Path] = {}
    for pkg in packages:
        base = (root / pkg).resolve()
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(parts)] = f
    return mods


def _targets(module: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - node.level + 1]
            base = ".".join(pkg + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
        return []
    return [n for n in names if n in known]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: modules it imports}`` within ``mods``; a module importing its own package's
    ``__init__`` (a parent) does not count as an edge."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
            for t in _targets(m, f, node, mods):
                if t != m and not m.startswith(t + "."):
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through ``component`` (a → b → … → a), for the failure message."""
    members = set(component)
    start = component[0]
    path, seen, node = [start], {start}, start
    while True:
        nxt = sorted(t for t in graph[node] if t in members)
        back = [t for t in nxt if t == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [t for t in nxt if t not in seen]
        if not fresh:
            return path + [nxt[0]] if nxt else path
        node = fresh[0]
        seen.add(node)
        path.append(node)


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of the longest prefix of ``module`` listed in ``layers``."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in layers:
            return layers[key]
    return None


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    """Edges from a lower layer to a higher one (an import that points up)."""
    bad = []
    for src, targets in sorted(graph.items()):
        ls = layer_of(src, layers)
        for dst in sorted(targets):
            ld = layer_of(dst, layers)
            if ls is not None and ld is not None and ld > ls:
                bad.append((src, dst))
    return bad
