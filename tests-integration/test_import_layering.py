"""Import layering, read from the sources (nothing is imported):

1. Inside each package the modules import one another without cycles: module-level imports
   (``from . import x`` included) and function-local ones alike, since an import hidden in a
   function still makes two modules depend on each other. A package's ``__init__`` that
   re-exports its submodules is not counted as a cycle (as in shared/tools/import_cycles.py):
   a cycle needs two modules other than ``__init__``s. The frontend's known cycles are listed
   in ``KNOWN_CYCLES``: the test fails when a new one appears or a listed one changes or goes
   away (update the list), so the list can only shrink; it is empty.
2. Across packages, a package imports only the kiln packages DESIGN.md's table declares
   (``DEPENDS_ON``), and its pyproject.toml declares exactly those.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"

#: folder -> import name
IMPORT_NAME = {
    "frontend": "kiln_frontend",
    "aotgrad": "kiln_aotgrad",
    "loopir": "kiln_loopir",
    "runtime": "kiln_runtime",
    "codegen-cpp": "kiln_codegen_cpp",
    "codegen-triton": "kiln_codegen_triton",
    "kiln": "kiln",
}

#: DESIGN.md's "depends on" column, kiln packages only (folder -> folders)
DEPENDS_ON = {
    "frontend": set(),
    "aotgrad": set(),
    "loopir": set(),
    "runtime": set(),
    "codegen-cpp": {"loopir", "runtime", "aotgrad"},
    "codegen-triton": {"loopir", "runtime", "aotgrad"},
    "kiln": {"frontend", "aotgrad", "loopir", "runtime", "codegen-cpp", "codegen-triton"},
}

#: cycles allowed to remain, per package folder: none (issue 26 broke the frontend's tracker
#: web; kiln_frontend/layers.py says how its layers reach upward without importing)
KNOWN_CYCLES: dict[str, list[frozenset[str]]] = {}


# ------------------------------------------------------------------------------ the graph


def package_modules(folder: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package's src/."""
    src = PACKAGES / folder / "src"
    mods = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def imported_names(path: Path, module: str) -> list[list[str]]:
    """For each name an import statement of the file brings in (anywhere in it: module level
    or inside functions), the absolute dotted names it may refer to, most specific first:
    ``from a import b`` gives ``["a.b", "a"]`` (``b`` is a submodule or a name in ``a``);
    relative imports are resolved against the file's package."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names += [[f"{base}.{alias.name}", base] for alias in node.names]
    return names


def import_graph(folder: str) -> tuple[dict[str, set[str]], dict[str, Path]]:
    """module -> the modules of the same package it imports. Imports of the module's own
    parent packages (``from . import x`` where ``x`` is not a module, ``from kiln_loopir import
    counters``) are left out: Python runs those ``__init__``s first anyway."""
    mods = package_modules(folder)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for candidates in imported_names(path, m):
            name = next((c for c in candidates if c in mods), candidates[-1])
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != m and not m.startswith(name + "."):
                edges[m].add(name)
    return edges, mods


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
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
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def cycles(folder: str) -> list[frozenset[str]]:
    """The package's cycles, each the set of its modules other than ``__init__``s (a
    component held together only by an ``__init__`` re-exporting submodules is left out)."""
    edges, mods = import_graph(folder)
    found = []
    for comp in strongly_connected(edges):
        core = frozenset(m for m in comp if mods[m].name != "__init__.py")
        if len(core) > 1:
            found.append(core)
    return found


def _cycle_path(edges: dict[str, set[str]], comp: frozenset[str]) -> str:
    """One concrete cycle through ``comp`` (for the failure message)."""
    start = min(comp)
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return " -> ".join(reversed(path)) + f" -> {start}"
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return ", ".join(sorted(comp))


# ------------------------------------------------------------------------------ the tests


def test_the_graph_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    """The builder itself: ``from . import x``, ``from .x import y`` and an import inside a
    function are edges; a re-exporting ``__init__`` alone makes no cycle."""
    pkg = tmp_path / "packages" / "demo" / "src" / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import h\nimport demo\n")
    monkeypatch.setitem(globals(), "PACKAGES", tmp_path / "packages")
    edges, _ = import_graph("demo")
    assert edges["demo.a"] == {"demo.b"}
    assert edges["demo.b"] == {"demo.sub.c"}
    assert edges["demo.sub.c"] == {"demo.a"}  # ``import demo``: its own package
    assert edges["demo"] == {"demo.a"}
    assert cycles("demo") == [frozenset({"demo.a", "demo.b", "demo.sub.c"})]
    (pkg / "b.py").write_text("")
    (pkg / "sub" / "c.py").write_text("")
    (pkg / "a.py").write_text("from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("from ..a import h\n")
    edges, _ = import_graph("demo")
    assert edges["demo.a"] == {"demo.sub.c"} and edges["demo.sub"] == {"demo.a"}
    assert cycles("demo") == []  # a -> demo.sub (its __init__) -> a: an __init__'s re-export


@pytest.mark.parametrize("folder", sorted(IMPORT_NAME))
def test_no_new_import_cycles_inside_a_package(folder):
    edges, _ = import_graph(folder)
    found = set(cycles(folder))
    known = set(KNOWN_CYCLES.get(folder, []))
    new = found - known
    gone = known - found
    lines = []
    for comp in sorted(new, key=sorted):
        near = max(known, key=lambda k: len(k & comp), default=frozenset())
        if near & comp:
            lines.append(f"a known cycle changed: modules added {sorted(comp - near)}, "
                         f"removed {sorted(near - comp)}")
        else:
            lines.append(f"new cycle of {len(comp)} modules: {_cycle_path(edges, comp)}")
    for comp in sorted(gone, key=sorted):
        if not any(comp & f for f in new):
            lines.append(f"a known cycle is gone (remove it from KNOWN_CYCLES): {sorted(comp)}")
    assert not lines, f"{folder}: " + "\n".join(lines)


def _kiln_imports(folder: str) -> dict[str, set[str]]:
    """Other kiln packages (folders) -> the modules of ``folder`` importing them."""
    by_import = {v: k for k, v in IMPORT_NAME.items()}
    out: dict[str, set[str]] = {}
    for m, path in package_modules(folder).items():
        for candidates in imported_names(path, m):
            other = by_import.get(candidates[-1].split(".")[0])
            if other is not None and other != folder:
                out.setdefault(other, set()).add(m)
    return out


@pytest.mark.parametrize("folder", sorted(IMPORT_NAME))
def test_a_package_imports_only_its_declared_kiln_dependencies(folder):
    undeclared = {k: sorted(v) for k, v in _kiln_imports(folder).items()
                  if k not in DEPENDS_ON[folder]}
    assert not undeclared, (f"{folder} imports kiln packages DESIGN.md does not let it "
                            f"(package: importing modules): {undeclared}")


@pytest.mark.parametrize("folder", sorted(IMPORT_NAME))
def test_pyproject_declares_the_design_dependencies(folder):
    project = tomllib.loads((PACKAGES / folder / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in project.get("dependencies", [])}
    dist = {f"kiln-{k}" if k != "kiln" else "kiln": k for k in IMPORT_NAME}
    declared = {dist[n] for n in names if n in dist}
    assert declared == DEPENDS_ON[folder]


def test_kiln_finds_its_codegens_only_through_entry_points():
    """Codegens are plug-ins: the kiln package names none of them (their toolchains and
    device waits come from their ``CodegenEntry``), so a new codegen needs no edit in kiln."""
    codegens = {f for f in IMPORT_NAME if f.startswith("codegen-")}
    named = {k: sorted(v) for k, v in _kiln_imports("kiln").items() if k in codegens}
    assert not named, f"kiln imports codegen packages by name: {named}"
