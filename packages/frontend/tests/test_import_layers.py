"""The frontend's layers (kiln_frontend/layers.py): tracker modules import only the tracker
modules below them and nothing above the trackers; a lower layer reaches a higher one only
through ``upper``, whose every name used in the sources is registered, once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kiln_frontend
import pytest
from kiln_frontend.layers import TRACKER_LAYERS, UpperNames, upper

SRC = Path(kiln_frontend.__file__).parent
PKG = "kiln_frontend"

#: modules above every tracker (layers 3-5 of layers.py; the higher-order operators' registry,
#: ``symbolic.hops`` itself, is a leaf over ``base`` that trackers use, its entries are above)
ABOVE_TRACKERS = ("symbolic.hops.", "symbolic.codegen", "symbolic.side_effects",
                  "symbolic.output_graph", "symbolic.handlers", "symbolic.translator",
                  "convert", "eval_frame", "api")


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package (``kiln_frontend.`` omitted) that ``module`` imports anywhere
    in its file (module level, inside functions, under TYPE_CHECKING)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = [PKG] + (package.split(".") if package else [])
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if not name.startswith(PKG + "."):
                continue
            name = name[len(PKG) + 1:]
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
                break
    return found


def test_tracker_modules_import_only_the_layers_below_them():
    modules = _modules()
    assert set(TRACKER_LAYERS) <= set(modules), "TRACKER_LAYERS names a module that is gone"
    rank = {m: i for i, m in enumerate(TRACKER_LAYERS)}
    wrong = []
    for m in TRACKER_LAYERS:
        for target in sorted(_imports(m, modules[m], modules)):
            if target in rank and rank[target] > rank[m]:
                wrong.append(f"{m} imports {target}, a layer above it (use layers.upper)")
            if target.startswith(ABOVE_TRACKERS):
                wrong.append(f"{m} imports {target}, above every tracker (use tx/codegen)")
    assert not wrong, "\n".join(wrong)


def test_every_name_reached_through_upper_is_registered():
    import kiln_frontend.symbolic  # noqa: F401  (imports every layer)

    used = {}
    for path in SRC.rglob("*.py"):
        for name in re.findall(r"\bupper\.([A-Za-z_]\w*)", path.read_text()):
            used.setdefault(name, path.relative_to(SRC))
    used.pop("provide", None)
    missing = {n: str(p) for n, p in used.items() if n not in upper.registered()}
    assert not missing, f"upper names used but never registered: {missing}"


def test_upper_refuses_a_second_registration_and_names_a_missing_one():
    names = UpperNames()

    @names.provide
    def wrap_thing():
        return 1

    assert names.wrap_thing is wrap_thing
    names.provide(wrap_thing)  # the same object again (a reloaded module): accepted
    with pytest.raises(ValueError, match="upper.wrap_thing registered twice"):
        names.provide(lambda: 2, name="wrap_thing")
    with pytest.raises(LookupError, match="upper.OtherThing is not registered"):
        names.OtherThing  # noqa: B018
    assert "wrap_thing" in names.registered()


def test_a_lower_tracker_builds_upper_trackers_through_upper():
    """``ConstantVariable.create`` (constant.py) of a tuple and a list: containers.py's
    trackers, reached through ``upper``."""
    from kiln_frontend.symbolic.variables.constant import ConstantVariable
    from kiln_frontend.symbolic.variables.containers import ListVariable, TupleVariable

    made = ConstantVariable.create((1, [2, 3]))
    assert type(made) is TupleVariable
    assert type(made.items[1]) is ListVariable
    assert made.as_python_constant() == (1, [2, 3])


_IMPORT_EACH_FIRST = r"""
import importlib, pathlib, sys
import torch  # noqa: F401  (loaded once: only kiln_frontend is imported afresh)
src = pathlib.Path(sys.argv[1])
bad = []
for path in sorted(src.rglob("*.py")):
    parts = ("kiln_frontend",) + path.relative_to(src).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    for loaded in [m for m in sys.modules if m.split(".")[0] == "kiln_frontend"]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        bad.append(f"{name}: {type(e).__name__}: {e}")
print("\n".join(bad))
"""


def test_every_module_imports_when_imported_first():
    """Layering at run time: importing any module first (``import kiln_frontend.shapes``)
    runs ``kiln_frontend.symbolic``'s ``__init__``, which imports every layer; a module
    above that needs the first one at module level would find it half initialized."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _IMPORT_EACH_FIRST, str(SRC)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", out.stdout
