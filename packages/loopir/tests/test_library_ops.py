"""An operator another library registered (``torch.library``) has no lowering and never will:
it runs as an aten fallback, an extern call to its kernel, instead of failing the graph with
MissingLowering (found by benchmarks/model_sweep.py: transformers' Mixtral calls
``transformers::grouped_mm_fallback``, and the whole graph ran eagerly). A missing lowering of
torch's own ops still fails naming the op (test_lowering_registry.py)."""

from __future__ import annotations

import kiln_loopir as K
import torch
from kiln_loopir import lowering as L
from torch.fx.experimental.proxy_tensor import make_fx


@torch.library.custom_op("kiln_loopir_test::row_cumsum", mutates_args=())
def row_cumsum(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.cumsum(x, dim=-1) * scale


@row_cumsum.register_fake
def _(x, scale):
    return torch.empty_like(x)


def f(x):
    return torch.relu(row_cumsum(x.sin(), 2.0)) + 1.0


def test_library_op_runs_as_a_fallback():
    x = torch.randn(3, 5)
    gm = make_fx(f)(x)
    op = torch.ops.kiln_loopir_test.row_cumsum.default
    assert op in [n.target for n in gm.graph.nodes] and op not in L.lowerings
    before = L.counters["aten_fallbacks"]["kiln_loopir_test::row_cumsum.default"]
    graph = K.lower(gm, [x])
    assert any(getattr(b, "fallback", False) for b in graph.buffers)
    assert L.counters["aten_fallbacks"]["kiln_loopir_test::row_cumsum.default"] == before + 1
    torch.testing.assert_close(K.interpret(K.schedule(graph))(x)[0], f(x))
