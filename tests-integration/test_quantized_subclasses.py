"""Quantized and float8 weights as traceable tensor subclasses through kiln (issue 29).

torchao 0.18 installs beside torch 2.13, but its tensors (``Int8Tensor``, ``Float8Tensor``)
override ``__torch_function__``, which kiln leaves uncaptured (a clean graph break,
docs/tensor-subclasses.md). So these tests carry two small subclasses of torchao's design that
dispatch in ``__torch_dispatch__`` only:

- ``Int8WeightOnly``: an int8 payload with per-output-channel scales, dequantized in
  ``__torch_dispatch__`` (weight-only quantization);
- ``Float8DynamicWeight``: a high-precision master weight that, at each matmul, scales the
  weight and the activation dynamically (amax -> scale -> cast to float8_e4m3fn) and calls
  ``torch._scaled_mm`` with the inverse scales (float8 training's forward).

Each model compiles into one graph with no eager fallback and matches eager. The int8 model
must stay int8 in memory: compiling and running it may add at most 10% to the bytes of live
tensors eager holds (a dequantized fp32 copy of the weight folded in at compile time would add
400%)."""

from __future__ import annotations

import gc

import kiln
import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from kiln.stats import counters
from kiln.testing import Int8WeightOnly

aten = torch.ops.aten
F8 = torch.float8_e4m3fn
F8_MAX = torch.finfo(F8).max


def _to_float8(x):
    """Dynamic scaling: the tensor's amax sets the scale that maps it onto float8's range."""
    scale = F8_MAX / x.abs().amax().clamp(min=1e-12).float()
    return (x.float() * scale).clamp(-F8_MAX, F8_MAX).to(F8), scale.reciprocal()


class Float8DynamicWeight(torch.Tensor):
    """A master weight [out, in] whose matmuls run in float8 with dynamic scales."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype,
                                                   device=data.device)

    def __init__(self, data):
        self.data_hp = data

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["data_hp"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["data_hp"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.detach.default:
            return cls(args[0].data_hp)
        if func is aten.t.default:  # linear's weight.t(): stays float8-able, transposed
            return _Float8Transposed(args[0].data_hp)
        args, kwargs = pytree.tree_map_only(cls, lambda w: w.data_hp, (args, kwargs))
        return func(*args, **kwargs)


class _Float8Transposed(Float8DynamicWeight):
    """``w.t()`` of a Float8DynamicWeight: the operand linear's addmm/mm receives."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape[::-1], dtype=data.dtype,
                                                   device=data.device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (aten.mm.default, aten.addmm.default):
            bias, (x, w) = (None, args) if func is aten.mm.default else (args[0], args[1:])
            x8, x_inv = _to_float8(x)
            w8, w_inv = _to_float8(w.data_hp)
            out = torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv,
                                   out_dtype=x.dtype)
            return out if bias is None else out + bias
        args, kwargs = pytree.tree_map_only(cls, lambda w: w.data_hp.t(), (args, kwargs or {}))
        return func(*args, **kwargs)


class QuantMLP(torch.nn.Module):
    """Two Linears whose weights are subclasses; biases plain."""

    def __init__(self, make_weight, d_in=256, d_hidden=512, d_out=64):
        super().__init__()
        torch.manual_seed(0)
        self.w1 = torch.nn.Parameter(make_weight(torch.randn(d_hidden, d_in) / d_in**0.5),
                                     requires_grad=False)
        self.b1 = torch.nn.Parameter(torch.randn(d_hidden) * 0.1, requires_grad=False)
        self.w2 = torch.nn.Parameter(make_weight(torch.randn(d_out, d_hidden) / d_hidden**0.5),
                                     requires_grad=False)

    def forward(self, x):
        return F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)


@pytest.fixture(autouse=True)
def _fresh(fresh_kiln):
    yield


def _live_tensor_bytes() -> int:
    """Bytes of every distinct storage held by a live tensor (a subclass's inner tensors
    included: they are tensors of their own)."""
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # (isinstance reads __class__: lazy modules warn)
            if obj.layout is not torch.strided or obj.is_meta or \
                    torch._C._dispatch_keys(obj).has(torch._C.DispatchKey.Python):
                continue  # wrapper subclasses hold no storage of their own; fakes none
            try:
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


def _check_one_graph(model, x):
    with torch.no_grad():
        expected = model(x)
        got = kiln.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(got, expected)
    assert counters["subclass_graphs"] == 1, dict(counters)
    assert kiln.stats().graphs_compiled == 1 and kiln.stats().eager_fallbacks == 0
    return got


def test_int8_weight_only_one_graph_matches_eager():
    model = QuantMLP(Int8WeightOnly.quantize)
    assert model.w1.qdata.dtype is torch.int8
    _check_one_graph(model, torch.randn(8, 256))


def test_int8_weights_stay_int8_in_memory_after_compiling():
    """Live tensor bytes of the model with its input and output: eager's, then after
    compiling and running twice (kiln's constants, caches and buffers included)."""
    x = torch.randn(4, 512)
    before = _live_tensor_bytes()
    model = QuantMLP(Int8WeightOnly.quantize, d_in=512, d_hidden=1024, d_out=512)
    with torch.no_grad():
        expected = model(x)
        eager = _live_tensor_bytes() - before
        compiled = kiln.compile(model, fullgraph=True)
        got = compiled(x)
        got = compiled(x)
        after_compile = _live_tensor_bytes() - before
    torch.testing.assert_close(got, expected)
    assert counters["subclass_graphs"] == 1 and kiln.stats().eager_fallbacks == 0
    assert eager >= sum(w.qdata.nbytes for w in (model.w1, model.w2))
    # the check can fail: a dequantized fp32 copy of the weights kept alive is seen
    folded = [w.dequantize() for w in (model.w1, model.w2)]
    assert _live_tensor_bytes() - before > 1.1 * after_compile
    del folded
    print(f"live tensor bytes: eager {eager}, compiled {after_compile}")
    assert after_compile <= 1.1 * eager, (after_compile, eager)


def test_float8_dynamic_scaling_one_graph_matches_eager(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # lower the graph here: a cache hit counts nothing
    model = QuantMLP(Float8DynamicWeight)
    x = torch.randn(8, 256)
    got = _check_one_graph(model, x)
    # torch._scaled_mm is an extern call by design (float8 casts run as aten fallbacks: loop
    # bodies do not compute in float8)
    assert "aten::_scaled_mm.default" not in kiln.stats().aten_fallbacks
    # float8 rounding really happened: the result differs from the fp32 matmuls
    with torch.no_grad():
        hp = F.linear(F.gelu(F.linear(x, model.w1.data_hp, model.b1)), model.w2.data_hp)
    assert not torch.allclose(got, hp, rtol=1e-4, atol=1e-4)
