"""Skips only while a package of the pipeline is genuinely missing (being written)."""

from __future__ import annotations

import importlib

import pytest


def _missing(module: str, attr: str | None = None) -> str | None:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        return f"{module} not available yet ({e})"
    if attr is not None and not hasattr(mod, attr):
        return f"{module}.{attr} not available yet"
    return None


def require_interpreter() -> None:
    """kiln_loopir.lower / schedule / interpret must exist."""
    for module in ("kiln_loopir.lowering", "kiln_loopir.scheduler", "kiln_loopir.interpreter"):
        reason = _missing(module)
        if reason:
            pytest.skip(reason)


def require_cpp() -> None:
    """The whole kiln pipeline on CPU: loopir, its wrapper generator, CppCodegen, runtime."""
    require_interpreter()
    for module, attr in (
        ("kiln_loopir.wrapper", "generate_wrapper"),
        ("kiln_codegen_cpp", "CppCodegen"),
        ("kiln_runtime", "load"),
    ):
        reason = _missing(module, attr)
        if reason:
            pytest.skip(reason)


@pytest.fixture
def needs_interpreter():
    require_interpreter()


@pytest.fixture
def needs_cpp():
    require_cpp()


@pytest.fixture(autouse=True)
def _graph_cache_off(monkeypatch):
    """The graph-level artifact cache (kiln.cache) would let one test's compile hit another's
    (or a previous run's) and skip the pipeline a test patches: off unless a test turns it on
    (test_cache*.py do, with their own KILN_CACHE_DIR)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
