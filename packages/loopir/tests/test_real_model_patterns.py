"""Graph patterns from real models that loopir used to refuse or send to the aten fallback
(issue 9): XLNet's integer ``arange`` with a float step, the ``as_strided_`` a decomposition
puts on a pooled result (Swin, ConvNeXt), DenseNet's concatenations of many inputs."""

from __future__ import annotations

import kiln_loopir as K
import torch
from helpers import check
from kiln_loopir.counters import counters
from kiln_loopir.ir import ScatterBuffer
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def _no_aten_fallback(graph):
    externs = [b for b in graph.buffers if getattr(b, "fallback", False)]
    assert not externs, externs


def test_integer_arange_with_float_step_is_integral():
    """``arange(0, 64, 2.0, dtype=int64)``: eager converts the step to int64 first; the
    index expression must stay integral (the C++ printer refuses ``1.0*i0``)."""
    def f(x):
        a = torch.ops.aten.arange.start_step(0, 16, 2.0, dtype=torch.int64)
        b = torch.ops.aten.arange.start_step(8, 0, -1.0, dtype=torch.int64)
        return x + a.float(), b * 3

    sched, graph = check(f, torch.randn(8))
    text = str(graph)
    assert "1.0*" not in text and "2.0*" not in text, text


def test_as_strided_inplace_on_a_computed_value():
    """``mean.as_strided_(...)`` on the pooled result (adaptive_avg_pool2d's 1x1 case) lowers
    as the view it makes, and later readers of the value see the new strides."""
    def f(x):
        m = aten.mean.dim(x, [-1, -2], True)
        aten.as_strided_.default(m, [2, 6, 1, 1], [6, 1, 6, 6])
        return m * 2.0 + 1.0

    x = torch.randn(2, 6, 5, 5).contiguous(memory_format=torch.channels_last)
    gm = make_fx(f)(x)  # no functionalization: the in-place op stays in the graph
    assert any(n.target is aten.as_strided_.default for n in gm.graph.nodes)
    graph = K.lower(gm, [x])
    _no_aten_fallback(graph)
    out = K.interpret(K.schedule(graph))(x)
    torch.testing.assert_close(out[0], f(x.clone()))


def test_cat_of_many_inputs_writes_slices():
    """More inputs than a where-chain should load: one loop per input writing into its slice
    of the result (no aten fallback), each fusing its own pointwise producer."""
    xs = [torch.randn(2, 1 + k, 3, 4) for k in range(12)]

    def f(*xs):
        return torch.cat([x.relu() if k % 2 else x for k, x in enumerate(xs)], 1) * 2.0

    before = sum(counters["aten_fallbacks"].values())
    sched, graph = check(f, *xs)
    assert sum(counters["aten_fallbacks"].values()) == before
    _no_aten_fallback(graph)
    assert len([b for b in graph.buffers if isinstance(b, ScatterBuffer)]) == len(xs) - 1


def test_cat_of_many_stored_parts_is_one_call():
    """DenseNet's shape: every part a convolution's result (nothing to fuse into a copy)
    but the first, a pooled loop: one ``aten.cat`` call, not a copy loop per part."""
    x = torch.randn(2, 4, 6, 6)
    ws = [torch.randn(3, 4, 1, 1) for _ in range(11)]

    def f(x, *ws):
        pooled = torch.nn.functional.avg_pool2d(x, 2) * 2.0
        parts = [pooled] + [torch.nn.functional.conv2d(pooled, w) for w in ws]
        return torch.cat(parts, 1).relu()

    before = sum(counters["aten_fallbacks"].values())
    sched, graph = check(f, x, *ws)
    assert sum(counters["aten_fallbacks"].values()) == before
    cats = [b for b in graph.buffers if getattr(b, "op", None) is aten.cat.default]
    assert len(cats) == 1, graph
    assert not [b for b in graph.buffers if isinstance(b, ScatterBuffer)]
