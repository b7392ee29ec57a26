"""``KILN_LOGS=perf`` through the kiln backend: each generated kernel and extern call of a
compiled graph is timed and set against the ATen graph's eager ops (docs/benchmarks.md)."""

from __future__ import annotations

import torch
import torch.nn as nn
from kiln.backend import kiln_backend
from kiln_runtime import CompiledGraph, profile


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) * 2.0


def test_perf_channel_times_kernels_and_externs_against_eager(monkeypatch):
    monkeypatch.setenv("KILN_LOGS", "perf")
    profile.reset()
    model = ConvBnRelu().eval()
    x = torch.randn(2, 3, 8, 8)
    gm = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        compiled = kiln_backend(gm, [x])
        for _ in range(3):
            out = compiled(x)
            out = out[0] if isinstance(out, (list, tuple)) else out
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    (prof,) = profile.profiles()
    assert prof.calls == 2 and prof.eager_calls == 2
    kinds = {s.kind for s in prof.steps}
    assert kinds == {"kernel", "extern"}
    conv = next(s for s in prof.steps if s.kind == "extern")
    assert prof.op_of(prof.extern_match[conv.index]) == "aten.convolution.default"
    assert all(s.calls == 2 and s.seconds > 0 and s.ms_per_call > 0 for s in prof.steps)
    text = profile.report()
    assert "(extern)" in text and "segment" in text and "convolution" in text
    profile.reset()


def test_perf_channel_off_leaves_the_wrapper_alone(monkeypatch):
    monkeypatch.delenv("KILN_LOGS", raising=False)
    profile.reset()
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() + 1,))
    with torch.no_grad():
        compiled = kiln_backend(gm, [torch.randn(4)])
        compiled(torch.randn(4))
    assert profile.profiles() == []
    flat = getattr(compiled.compiled, "flat", compiled.compiled)
    assert isinstance(flat, CompiledGraph)  # the loaded wrapper itself, not a timed copy
