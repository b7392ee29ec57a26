"""kiln depends on the whole pipeline, so a module of it that does not import fails the test
that needs it (the import error is the failure; nothing is skipped for it)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

# pytest runs with --import-mode=importlib, which does not put this folder on sys.path: do it
# here so that the helper modules beside the tests (_nets.py) import
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Tests that compile CPU tensors with the Triton codegen run Triton's interpreter, which Triton
# reads when it is first imported (codegen-triton's conftest does the same); a GPU machine runs
# the real compiler.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _require(module: str, attr: str | None = None) -> None:
    mod = importlib.import_module(module)
    if attr is not None:
        getattr(mod, attr)


def require_interpreter() -> None:
    """kiln_loopir.lower / schedule / interpret import."""
    for module in ("kiln_loopir.lowering", "kiln_loopir.scheduler", "kiln_loopir.interpreter"):
        _require(module)


def require_cpp() -> None:
    """The whole kiln pipeline on CPU: loopir, its wrapper generator, CppCodegen, runtime."""
    require_interpreter()
    for module, attr in (
        ("kiln_loopir.wrapper", "generate_wrapper"),
        ("kiln_codegen_cpp", "CppCodegen"),
        ("kiln_runtime", "load"),
    ):
        _require(module, attr)


@pytest.fixture
def needs_interpreter():
    require_interpreter()


@pytest.fixture
def needs_cpp():
    require_cpp()


@pytest.fixture(autouse=True)
def kiln_cache_dir(tmp_path, monkeypatch):
    """Each test's own empty ``KILN_CACHE_DIR``: a cache shared between tests or sessions
    (``~/.cache/kiln``) would let a compile hit what an earlier one stored, and a test that
    reads kiln.stats() counters (compiles, kernel builds) would then pass without the work it
    means to count. A test that sets ``KILN_CACHE_DIR`` itself (monkeypatch) overrides it."""
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    return path


@pytest.fixture
def graph_cache_on(kiln_cache_dir, monkeypatch, needs_cpp):
    """The graph cache on, in this test's own cache folder (returned)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1")
    return kiln_cache_dir


@pytest.fixture(autouse=True)
def _graph_cache_off(monkeypatch):
    """The graph-level artifact cache (kiln.cache) would let one test's compile hit another's
    (or a previous run's) and skip the pipeline a test patches: off unless a test turns it on
    (test_cache*.py do, with their own KILN_CACHE_DIR)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
