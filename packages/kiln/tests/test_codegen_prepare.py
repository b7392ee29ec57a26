"""``CodegenEntry.prepare``: the backend tells a graph's codegen about it before tracing (the
Triton codegen starts its compile workers then, so their start overlaps tracing)."""

from __future__ import annotations

import torch
from kiln.backend import prepare_codegen
from kiln.options import Options
from kiln_loopir.codegen_registry import CodegenEntry, get_codegen, register_codegen

_PREPARED: list[int] = []


def _probe_codegen() -> str:
    """A registered codegen whose ``prepare`` records the sizes it is given."""
    name = "prepare_probe"
    try:
        get_codegen(name)
    except ValueError:
        register_codegen(CodegenEntry(name, devices=("cpu",), compile_error=RuntimeError,
                                      build=lambda options: None, priority=-100,
                                      prepare=_PREPARED.append))
    return name


def test_prepare_gets_the_graph_size_before_tracing():
    name = _probe_codegen()
    _PREPARED.clear()
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    prepare_codegen(gm, [torch.randn(2, 4)], Options.from_user({"codegen": name}))
    assert _PREPARED == [len(gm.graph.nodes)]


def test_triton_prepare_starts_no_workers_without_a_gpu():
    from kiln_codegen_triton import CODEGEN, compile_workers

    assert CODEGEN.prepare is not None
    CODEGEN.prepare(10_000)
    assert not compile_workers._POOL  # no CUDA here: nothing to start
