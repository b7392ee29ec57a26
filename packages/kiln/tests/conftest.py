"""kiln depends on the whole pipeline, so a module of it that does not import fails the test
that needs it (the import error is the failure; nothing is skipped for it)."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

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
def _graph_cache_off(monkeypatch):
    """The graph-level artifact cache (kiln.cache) would let one test's compile hit another's
    (or a previous run's) and skip the pipeline a test patches: off unless a test turns it on
    (test_cache*.py do, with their own KILN_CACHE_DIR)."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
