"""Scatters (ScatterBuffer), *_scatter selects, and input mutation write-backs."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
from helpers import check
from kiln_loopir.ir import ScatterBuffer

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_scatter_family(dtype):
    x = (torch.randn(5, 6) * 4).to(dtype)
    idx = torch.tensor([[0, 1, 2, 0, 1, 3], [4, 0, 1, 2, 3, 4]])
    src = (torch.randn(2, 6) * 4).to(dtype)
    tol = {} if dtype in (torch.float32, torch.int64) else dict(atol=2e-2, rtol=2e-2)

    def f(x, idx, src):
        return (x.scatter(0, idx, src), x.scatter_add(0, idx, src) * 2, x.scatter(1, idx, 1),
                x.index_put((idx[0],), src[0, :1], accumulate=True),
                torch.scatter_reduce(x, 0, idx, src, "sum"))

    sched, graph = check(f, x, idx, src, **tol)
    assert any(isinstance(b, ScatterBuffer) for b in graph.buffers)
    assert not K.counters["aten_fallbacks"].get("aten::scatter_add.default")


def test_index_put_two_indices_and_broadcast_values():
    x = torch.zeros(4, 5, 3)
    i = torch.tensor([0, 2, 3])
    j = torch.tensor([1, 1, 4])
    v = torch.randn(3)
    def f(x, i, j, v):
        y = x.clone()
        y[i, :, j.clamp(max=2)] = v[:1]
        return x.index_put((i, j), v, accumulate=True), y

    check(f, x, i, j, v)


def test_slice_and_select_scatter():
    x = torch.randn(5, 6)
    src = torch.randn(5, 2)

    def f(x, src):
        y = x.clone()
        y[:, 1:5:2] = src
        z = x.clone()
        z[3] = 7.0
        w = x.clone()
        w[-2:, :2] += src[-2:]
        return y, z, w

    sched, graph = check(f, x, src)
    assert not K.counters["aten_fallbacks"].get("aten::slice_scatter.default")


def test_input_mutation_write_back():
    def f(x, y):
        out = x + 1
        x.mul_(2)
        y[0] = 5.0
        return out, x * 3

    fn = torch.func.functionalize(f, remove="mutations")
    x, y = torch.randn(3, 4), torch.randn(2, 2)
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(x.clone(), y.clone())
    assert any(n.target is torch.ops.aten.copy_.default for n in gm.graph.nodes)
    sched = K.schedule(K.lower(gm))
    xa, ya = x.clone(), y.clone()
    out = K.interpret(sched)(xa, ya)
    xb, yb = x.clone(), y.clone()
    ref = f(xb, yb)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])
    torch.testing.assert_close(xa, xb)
    torch.testing.assert_close(ya, yb)


def test_mutating_an_intermediate_is_refused():
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        y = x.clone()
        y.add_(1)
        return y

    gm = make_fx(f, decomposition_table=core_aten_decompositions())(torch.randn(3))
    with pytest.raises(K.LoweringError):
        K.lower(gm)


def test_fallback_keeps_results_correct_for_unknown_ops():
    x = torch.randn(4, 6)
    sched, graph = check(lambda x: (torch.special.i1(x) + torch.sort(x, 1).values,
                                    torch.nn.functional.max_pool1d(x.unsqueeze(0), 2)[0].sin()), x)
    assert any(getattr(b, "fallback", False) for b in graph.buffers)
