"""``CodegenEntry.prepare``: the backend tells a graph's codegen about it before tracing (the
Triton codegen starts its compile workers then, so their start overlaps tracing)."""

from __future__ import annotations

import pytest
import torch
from kiln.backend import prepare_codegen
from kiln.options import Options
from kiln_loopir import codegen_registry
from kiln_loopir.codegen_registry import CodegenEntry, register_codegen

_PREPARED: list[int] = []


@pytest.fixture
def probe_codegen():
    """A codegen registered for this test only, whose ``prepare`` records what it is given
    (other tests list the known codegens: it must not outlive the test)."""
    name = "prepare_probe"
    register_codegen(CodegenEntry(name, devices=("cpu",), compile_error=RuntimeError,
                                  build=lambda options: None, priority=-100,
                                  prepare=_PREPARED.append))
    yield name
    codegen_registry._registered.pop(name, None)


def test_prepare_gets_the_graph_size_before_tracing(probe_codegen):
    name = probe_codegen
    _PREPARED.clear()
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    prepare_codegen(gm, [torch.randn(2, 4)], Options.from_user({"codegen": name}))
    assert _PREPARED == [len(gm.graph.nodes)]


def test_triton_prepare_starts_workers_exactly_where_a_gpu_is():
    """A model-sized graph starts the compile workers on a machine with CUDA (the lent GPU
    machine) and none without (CI), and never under the Triton interpreter."""
    from kiln_codegen_triton import CODEGEN, compile_workers
    from kiln_codegen_triton.launcher import _interpreting

    assert CODEGEN.prepare is not None
    CODEGEN.prepare(10_000)
    expected = torch.cuda.is_available() and not _interpreting()
    assert bool(compile_workers._POOL) == expected, (compile_workers._POOL, expected)
