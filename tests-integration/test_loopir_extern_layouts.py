"""The layout of an extern's result is the one the op really returns for the layouts its
inputs have after lowering (not the one traced for eager's input layouts).

Regression (issue 9): in Llama-like attention the query is a pointwise result (rotary
embedding) of a permuted view, which eager keeps laid out ``[b, t, h, d]``; loopir realizes
it contiguous, SDPA then returns a contiguous ``[b, h, t, d]`` tensor, while the traced meta
said ``[b, t, h, d]``: the kernel after SDPA read it transposed."""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# loopir's test helpers (trace, lower, schedule, interpret, compare with eager)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "loopir" / "tests"))

import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F
from helpers import _Wrap, check
from kiln_loopir.ir import ExternKernel, MultiOutput
from kiln_loopir.sizevars import sympify

B, T, H, D = 2, 8, 4, 16


def attention(x, wq, wk, wv):
    """q, k, v: pointwise results of permuted views; the output transposed back."""
    q = (x @ wq).view(B, T, H, D).transpose(1, 2) * 0.5 + 1.0
    k = (x @ wk).view(B, T, H, D).transpose(1, 2).sin()
    v = (x @ wv).view(B, T, H, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(B, T, H * D) + 1.0


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(B, T, H * D)] + [torch.randn(H * D, H * D) for _ in range(3)]


def _lowered(args):
    import kiln_aotgrad

    return K.lower(kiln_aotgrad.trace_inference(_Wrap(attention), list(args)), args)


def _sdpa_output(graph):
    (k,) = [b for b in graph.buffers if isinstance(b, ExternKernel) and "scaled_dot_product" in str(b.op)]
    return k, [o for o in k.outputs if isinstance(o, MultiOutput)][0]


def test_sdpa_result_layout_is_the_real_one():
    args = _inputs()
    graph = _lowered(args)
    kernel, out = _sdpa_output(graph)
    real_inputs = [torch.empty_strided([int(s) for s in a.layout.size], [int(s) for s in a.layout.stride])
                   for a in kernel.inputs[:3]]
    real = kernel.op(*real_inputs, *kernel.inputs[3:], **kernel.kwargs)[0]
    assert [int(sympify(s)) for s in out.layout.stride] == list(real.stride())


def test_attention_after_permuted_pointwise_matches_eager():
    check(attention, *_inputs(), via="aotgrad", atol=1e-4)


def test_interpreter_refuses_an_extern_result_with_another_layout():
    """The oracle checks the declared layout instead of copying the result into it, so a
    wrong extern layout fails there too (the differential test relies on it)."""
    args = _inputs()
    graph = _lowered(args)
    _, out = _sdpa_output(graph)
    size = out.layout.size
    bthd = [size[1] * size[2] * size[3], size[3], size[1] * size[3], 1]
    contiguous = [size[1] * size[2] * size[3], size[2] * size[3], size[3], 1]
    wrong = contiguous if list(out.layout.stride) == bthd else bthd  # not the real one
    out.layout = type(out.layout)(out.layout.device, out.layout.dtype, size, wrong)
    with pytest.raises(RuntimeError, match="strides"):
        K.interpret(K.schedule(graph))(*args)


def test_attention_symbolic_sizes_matches_eager():
    """Symbolic sizes: the real input layout is faked with ``empty_permuted`` over SymInts."""
    import kiln_aotgrad
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    args = _inputs()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = [mode.from_tensor(args[0], symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]))]
    fakes += [mode.from_tensor(a) for a in args[1:]]
    graph = K.lower(kiln_aotgrad.trace_inference(_Wrap(attention_any_length), fakes), fakes)
    _, out = _sdpa_output(graph)
    assert any(sympify(s).free_symbols for s in out.layout.size)
    run = K.interpret(K.schedule(graph))
    for t in (8, 5):
        x = torch.randn(B, t, H * D)
        torch.testing.assert_close(run(x, *args[1:])[0], attention_any_length(x, *args[1:]), atol=1e-4, rtol=1e-4)


def attention_any_length(x, wq, wk, wv):
    b, t, _ = x.shape
    q = (x @ wq).view(b, t, H, D).transpose(1, 2) * 0.5 + 1.0
    k = (x @ wk).view(b, t, H, D).transpose(1, 2).sin()
    v = (x @ wv).view(b, t, H, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, t, H * D) + 1.0


def test_storage_under_an_aliasing_extern_result_is_not_lent(monkeypatch):
    """An extern whose result may alias its input (a view-returning aten op): the input's
    storage must outlive the result, so the memory plan never hands it to a later buffer."""
    from kiln_loopir import lowering as L
    from kiln_loopir import lowerings as _registered  # noqa: F401
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten
    monkeypatch.delitem(L.lowerings, aten.diagonal.default)
    monkeypatch.setitem(L.fallbacks, aten.diagonal.default, "test: a view-returning extern")

    def f(x):
        d = aten.diagonal.default(x.sin())  # a view of the sin buffer
        return (d.unsqueeze(1).expand(4, 4) * 2.0).cos()  # same layout as the sin buffer

    x = torch.randn(4, 4)
    graph = K.lower(make_fx(f)(x), [x])
    sched = K.schedule(graph)
    assert not [a for s in sched.steps for a in s.allocations if a.reuses]
    torch.testing.assert_close(K.interpret(sched)(x)[0], f(x))
