"""The bytecode layer for the pure-Python bytecode tests (not a test module).

``kiln_frontend/__init__`` may need torch or the C extension; the bytecode layer needs neither,
so when the package does not import, its ``bytecode`` subpackage is loaded under a bare
parent package."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _import_bytecode():
    try:
        return importlib.import_module("kiln_frontend.bytecode")
    except ImportError:
        spec = importlib.util.find_spec("kiln_frontend")
        parent = types.ModuleType("kiln_frontend")
        parent.__path__ = list(spec.submodule_search_locations)
        sys.modules["kiln_frontend"] = parent
        return importlib.import_module("kiln_frontend.bytecode")


bc = _import_bytecode()
