"""Loop order of a pointwise group follows the stores that reach memory: a BatchNorm written as
functional ops (timm's BatchNormAct2d) whose buffer stays in registers keeps eager's NCHW
layout, while the group's real store (its SiLU) feeds a channels-last depthwise convolution.
Ordered by the BatchNorm's layout, the contiguous channel dim sat outside a strided innermost
loop (EfficientNet-B0 on the CPU: 16x the memory traffic, kiln slower than eager)."""

from __future__ import annotations

import kiln_aotgrad
import kiln_loopir
import kiln_loopir.graph_lowering
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx
from kiln_loopir.counters import counters
from kiln_loopir.ir import FusedGroup


class BatchNormAct(nn.BatchNorm2d):
    """BatchNorm then SiLU in one forward through F.batch_norm (not folded into the conv)."""

    def forward(self, x):
        return F.silu(F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                   self.bias, False, 0.0, self.eps))


class PointwiseBnDepthwise(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.pw = nn.Conv2d(8, c, 1, bias=False)
        self.bn = BatchNormAct(c)
        self.dw = nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=False)

    def forward(self, x):
        return self.dw(self.bn(self.pw(self.stem(x))))


def _model():
    torch.manual_seed(0)
    m = PointwiseBnDepthwise().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, torch.randn(2, 3, 10, 12)


def test_bn_act_group_runs_channels_innermost(monkeypatch):
    # the BatchNorm's buffer in eager's NCHW layout, as before values read from channels-last
    # buffers were realized channels-last (the next test): the reorder alone
    monkeypatch.setattr(kiln_loopir.graph_lowering, "_reads_channels_last", lambda pw: False)
    m, x = _model()
    with torch.no_grad():
        aten_gm = kiln_aotgrad.trace_inference(torch.fx.symbolic_trace(m), [x])
        before = counters["groups_reordered"]
        sched = kiln_loopir.schedule(kiln_loopir.lower(aten_gm))
    assert counters["groups_reordered"] == before + 1
    (g,) = [s for s in sched.steps if isinstance(s, FusedGroup) and s.internal_buffers]
    (stored,) = [n for n in g.nodes if n.buffer.name not in g.internal_buffers]
    assert list(stored.buffer.get_stride())[1] == 1  # the store is channels-last
    assert g.outer[-1] == 16  # so the channel loop is innermost


def test_bn_act_between_convs_matches_eager():
    m, x = _model()
    with torch.no_grad():
        (got,) = compile_fx(torch.fx.symbolic_trace(m), [x])(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)


class SqueezeExcite(nn.Module):
    """EfficientNet's block middle: depthwise conv, BatchNorm+SiLU, squeeze-excite (global
    pool, two 1x1 convs, sigmoid gate), then the pointwise projection."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn = BatchNormAct(c)
        self.reduce, self.expand = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)
        self.proj = nn.Conv2d(c, 8, 1, bias=False)

    def forward(self, x):
        y = self.bn(self.dw(self.stem(x)))
        gate = torch.sigmoid(self.expand(F.silu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.proj(y * gate)


def test_values_computed_from_channels_last_stay_channels_last():
    """The BatchNorm+SiLU value the pool and the gate read is realized channels-last like the
    conv it comes from (eager's NCHW meant a transposing read in the pool and one more in the
    gate's product)."""
    torch.manual_seed(0)
    m, x = SqueezeExcite().eval(), torch.randn(2, 3, 10, 12)
    with torch.no_grad():
        m.bn.running_var.uniform_(0.5, 2.0)
        gm = torch.fx.symbolic_trace(m)
        graph = kiln_loopir.lower(kiln_aotgrad.trace_inference(gm, [x]))
        (got,) = compile_fx(gm, [x])(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    outputs = set(graph.output_names())
    computed = [b for b in graph.buffers if type(b).__name__ == "ComputedBuffer"
                and len(b.get_size()) == 4 and b.name not in outputs
                and all(int(d) > 1 for d in b.get_size())]
    assert computed, "the BatchNorm+SiLU value should be realized (pool and gate both read it)"
    assert all(list(b.get_stride())[1] == 1 for b in computed), [
        (b.name, list(b.get_stride())) for b in computed]
