"""The brief's seed graphs: fusion shapes, dynamic sizes, hand-built FX graphs, golden text."""

from __future__ import annotations

import logging

import kiln_loopir as K
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from helpers import aten_graph, check
from kiln_loopir.ir import ComputedBuffer, FusedGroup

aten = torch.ops.aten


def _loads_stores(group: FusedGroup):
    loads = [d for n in group.nodes for d in n.reads]
    stores = [d for n in group.nodes for d in n.writes]
    return loads, stores


def test_cos_plus_sin_one_group_one_load_each_one_store():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    sched, graph = check(lambda x, y: torch.cos(x) + torch.sin(y), x, y)
    assert len(sched.steps) == 1 and len(sched.groups) == 1
    loads, stores = _loads_stores(sched.groups[0])
    assert sorted(d.name for d in loads) == ["arg0", "arg1"]
    assert len(stores) == 1
    assert len([b for b in graph.buffers if isinstance(b, ComputedBuffer)]) == 1


def _symbolic_graph(fn, *args):
    return aten_graph(fn, *args, mode="symbolic")


def test_dynamic_sin_cos_two_stores():
    def f(x):
        y = x.sin()
        z = y.cos()
        return y, z

    x = torch.randn(4, 8)
    gm = _symbolic_graph(f, x)
    graph = K.lower(gm)
    text = str(graph)
    assert "float32[s0, s1] stride [s1, 1]" in text
    assert "i1 + i0*s1" in text
    sched = K.schedule(graph)
    assert len(sched.groups) == 1
    g = sched.groups[0]
    assert [str(o) for o in g.outer] == ["s0", "s1"]
    assert len([d for n in g.nodes for d in n.writes]) == 2
    fn = K.interpret(sched)
    for shape in [(4, 8), (3, 5), (2, 9)]:
        x = torch.randn(shape)
        y, z = fn(x)
        torch.testing.assert_close(y, x.sin())
        torch.testing.assert_close(z, x.sin().cos())


def test_dynamic_sum_div_shape():
    x = torch.randn(5, 7)
    gm = _symbolic_graph(lambda x: x.sum(1) / x.shape[1], x)
    sched = K.schedule(K.lower(gm))
    assert len(sched.groups) == 1
    fn = K.interpret(sched)
    for shape in [(5, 7), (2, 3)]:
        x = torch.randn(shape)
        torch.testing.assert_close(fn(x)[0], x.sum(1) / x.shape[1])


def test_static_sum_div_shape():
    x = torch.randn(5, 7)
    sched, _ = check(lambda x: x.sum(1) / x.shape[1], x)
    assert len(sched.groups) == 1


@pytest.mark.parametrize("shape", [(8, 32), (2, 3, 16)])
def test_softmax_and_layernorm_groups(shape):
    x = torch.randn(shape)
    n = shape[-1]
    w, b = torch.randn(n), torch.randn(n)
    for fn, args in [(lambda x: torch.softmax(x, -1), (x,)),
                     (lambda x, w, b: F.gelu(F.layer_norm(x, (n,), w, b)), (x, w, b)),
                     (lambda x: torch.log_softmax(x, -1), (x,))]:
        sched, _ = check(fn, *args, atol=1e-5)
        assert len(sched.groups) <= 2
        red = [g for g in sched.groups if g.is_reduction()]
        assert len(red) == 1
        assert red[0].nodes[-1].kind == "pointwise"  # the epilogue is fused


def _hand_built_cos_sin():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    c = g.call_function(aten.cos.default, (x,))
    s = g.call_function(aten.sin.default, (y,))
    a = g.call_function(aten.add.Tensor, (c, s))
    g.output((a,))
    return torch.fx.GraphModule({}, g)


def test_hand_built_fx_graph():
    gm = _hand_built_cos_sin()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    graph = K.lower(gm, [x, y])
    sched = K.schedule(graph)
    assert len(sched.groups) == 1
    torch.testing.assert_close(K.interpret(sched)(x, y)[0], x.cos() + y.sin())


def test_hand_built_softmax_and_layernorm():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    w = g.placeholder("w")
    sm = g.call_function(aten._softmax.default, (x, -1, False))
    ln = g.call_function(aten.native_layer_norm.default, (x, [8], w, None, 1e-5))
    ln0 = g.call_function(__import__("operator").getitem, (ln, 0))
    ge = g.call_function(aten.gelu.default, (ln0,))
    g.output((sm, ge))
    gm = torch.fx.GraphModule({}, g)
    xv, wv = torch.randn(4, 8), torch.randn(8)
    graph = K.lower(gm, [xv, wv])
    sched = K.schedule(graph)
    out = K.interpret(sched)(xv, wv)
    torch.testing.assert_close(out[0], torch.softmax(xv, -1))
    torch.testing.assert_close(out[1], F.gelu(F.layer_norm(xv, (8,), wv)), atol=1e-5, rtol=1e-5)
    assert len(sched.groups) == 1  # both reduce rows of x: fused horizontally


GOLDEN_GRAPH = """\
LoopGraph device=cpu
arg0: InputBuffer float32[4, 8] stride [8, 1]  # input 0
arg1: InputBuffer float32[8] stride [1]  # input 1
buf0: ComputedBuffer float32[4] stride [1]
  Reduction sum ranges [4] reduction_ranges [8]
    tmp0 = ops.load(arg0, r0 + 8*i0)
    tmp1 = ops.load(arg1, r0)
    tmp2 = ops.mul(tmp0, tmp1)
    tmp3 = ops.reduction(float32, float32, sum, tmp2)
    ops.store_reduction(buf0, i0, tmp3)
buf1: ComputedBuffer float32[4] stride [1]
  Pointwise ranges [4]
    tmp0 = ops.load(buf0, i0)
    tmp1 = ops.relu(tmp0)
    ops.store(buf1, i0, tmp1)
return (buf1,)"""

GOLDEN_SCHEDULE = """\
Schedule device=cpu
arg0: InputBuffer float32[4, 8] stride [8, 1]  # input 0
arg1: InputBuffer float32[8] stride [1]  # input 1
group0: FusedGroup outer [4]
  alloc buf0 float32[4] stride [1] internal
  alloc buf1 float32[4] stride [1]
  buf0: reduction inner [8] sum
    tmp0 = ops.load(arg0, r0 + 8*i0)
    tmp1 = ops.load(arg1, r0)
    tmp2 = ops.mul(tmp0, tmp1)
    tmp3 = ops.reduction(float32, float32, sum, tmp2)
    ops.store_reduction(buf0, i0, tmp3)
  buf1: pointwise
    tmp0 = ops.load(buf0, i0)
    tmp1 = ops.relu(tmp0)
    ops.store(buf1, i0, tmp1)
  internal: buf0
  free: buf0
return (buf1,)"""


def test_golden_text():
    x, w = torch.randn(4, 8), torch.randn(8)
    gm = aten_graph(lambda x, w: torch.relu((x * w).sum(1)), x, w)
    graph = K.lower(gm)
    assert str(graph) == GOLDEN_GRAPH
    sched = K.schedule(graph)
    assert str(sched) == GOLDEN_SCHEDULE


def test_fusion_log_explains(caplog):
    x = torch.randn(4, 8)
    # special_i1 is a fallback extern between two pointwise ops: they cannot fuse across it
    gm = aten_graph(lambda x: (torch.special.i1(x.sin()).cos(), x.t() * 2), x)
    with caplog.at_level(logging.DEBUG, logger="kiln.fusion"):
        sched = K.schedule(K.lower(gm))
    msgs = [r.getMessage() for r in caplog.records if r.name == "kiln.fusion"]
    assert any("not fused" in m or "new group" in m for m in msgs)
    assert len(sched.externs) == 1


def test_memory_plan_reuse_and_free():
    x = torch.randn(16, 16)
    # a chain of externs between pointwise ops forces intermediate buffers
    def f(x):
        a = x.sin() @ x
        b = a.cos() @ x
        c = b.exp() @ x
        return c.tanh()

    sched, graph = check(f, x, atol=1e-4)
    freed = [n for s in sched.steps for n in s.frees]
    assert freed, "intermediates are freed"
    outs = set(graph.output_names())
    assert not outs & set(freed)
    reused = [a for s in sched.steps for a in s.allocations if a.reuses]
    assert reused, str(sched)
