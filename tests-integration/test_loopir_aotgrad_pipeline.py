"""loopir on graphs from kiln_aotgrad.trace_inference (here, not in loopir's tests: loopir does not
depend on aotgrad)."""

from __future__ import annotations

import kiln_aotgrad
import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F


def _symbolic(*tensors):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())) for t in tensors]


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _trace(mod, inputs):
    return kiln_aotgrad.trace_inference(mod, inputs)


def test_seed_cos_sin():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = _trace(_Fn(lambda x, y: torch.cos(x) + torch.sin(y)), [x, y])
    sched = K.schedule(K.lower(gm))
    assert len(sched.steps) == 1
    torch.testing.assert_close(K.interpret(sched)(x, y)[0], x.cos() + y.sin())


def test_seed_dynamic_sin_cos():
    def f(x):
        y = x.sin()
        z = y.cos()
        return y, z

    gm = _trace(_Fn(f), _symbolic(torch.randn(4, 8)))
    graph = K.lower(gm)
    assert "i1 + i0*s1" in str(graph)
    sched = K.schedule(graph)
    assert len(sched.groups) == 1 and len(sched.groups[0].writes) == 2
    for shape in [(4, 8), (5, 3)]:
        x = torch.randn(shape)
        y, z = K.interpret(sched)(x)
        torch.testing.assert_close(z, x.sin().cos())


class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.ln(x))))
        return torch.softmax(x + h, -1), x.var(-1), x.amax(1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_mlp_block(dynamic):
    m = Block().eval()
    x = torch.randn(2, 5, 16)
    inputs = _symbolic(x) if dynamic else [x]
    gm = _trace(m, inputs)
    sched = K.schedule(K.lower(gm))
    out = K.interpret(sched)(x)
    with torch.no_grad():
        ref = m(x)
    for a, b in zip(out, ref, strict=False):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not K.counters["aten_fallbacks"].get("aten::addmm.default")


def test_conv_bn_relu_pool():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    x = torch.randn(2, 3, 8, 8)
    gm = _trace(m, [x])
    sched = K.schedule(K.lower(gm))
    with torch.no_grad():
        torch.testing.assert_close(K.interpret(sched)(x)[0], m(x), atol=1e-5, rtol=1e-5)


def test_dynamic_3d_linear_stays_symbolic():
    # batch and sequence dims dynamic, features static (the frontend's usual marking):
    # F.linear's 3-D fast path must not specialize them (kiln_aotgrad.FUNCTION_RULES)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    m = torch.nn.Linear(8, 4).eval()
    env = ShapeEnv()
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
    )
    fake = FakeTensorMode(shape_env=env).from_tensor(torch.randn(2, 10, 8), symbolic_context=ctx)
    graph = K.lower(_trace(m, [fake]))
    assert len(graph.sizevars) == 2, str(graph)
    assert not env.replacements
    run = K.interpret(K.schedule(graph))
    for shape in [(2, 10, 8), (3, 7, 8), (1, 1, 8)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(run(x)[0], m(x), atol=1e-5, rtol=1e-5)
