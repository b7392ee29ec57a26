"""Traceable tensor subclasses (``__tensor_flatten__``/``__tensor_unflatten__`` with
``__torch_dispatch__``) are captured: one graph under ``fullgraph=True`` whose inputs are the
subclass tensors, guarded on the subclass type, its flatten metadata and its inner tensors
(a change recompiles), results equal to eager's. A subclass that overrides
``__torch_function__`` stays a clean graph break naming its class. docs/tensor-subclasses.md"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported
from torch.testing._internal.two_tensor import TwoTensor

pytestmark = pytest.mark.usefixtures("fresh_frontend")
aten = torch.ops.aten


class Int8Weight(torch.Tensor):
    """A quantized weight: an int8 payload, one float scale per row, and a ``zero`` point
    (flatten metadata: a different one must recompile). Any op dequantizes it first."""

    @staticmethod
    def __new__(cls, qdata, scale, zero=0):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype,
                                                   device=qdata.device)

    def __init__(self, qdata, scale, zero=0):
        self.qdata, self.scale, self.zero = qdata, scale, zero

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["qdata", "scale"], (self.zero,)

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["qdata"], inner["scale"], *ctx)

    def __repr__(self):
        return f"Int8Weight(zero={self.zero})"

    def dequantize(self):
        return (self.qdata.to(self.scale.dtype) - self.zero) * self.scale[:, None]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            (w,) = args
            return cls(w.qdata, w.scale, w.zero)
        args, kwargs = pytree.tree_map_only(cls, lambda w: w.dequantize(), (args, kwargs or {}))
        return func(*args, **kwargs)

    @classmethod
    def quantize(cls, w, zero=0):
        scale = w.abs().amax(dim=1) / 127
        q = (w / scale[:, None]).round().clamp(-127, 127) + zero
        return cls(q.to(torch.int8), scale, zero)


def two(shape=(3, 4)):
    return TwoTensor(torch.randn(shape), torch.randn(shape))


def assert_two_close(got, expected):
    assert type(got) is type(expected)
    torch.testing.assert_close(got.a, expected.a)
    torch.testing.assert_close(got.b, expected.b)


def f(x, y):
    return (x * y).sin() + x.sum(0)


def test_two_tensor_in_and_out_in_one_graph():
    backend = CountingBackend()
    x, y = two(), torch.randn(3, 4)
    got = kiln_compile(f, backend=backend, fullgraph=True)(x, y)
    assert_two_close(got, f(x, y))
    assert len(backend.graphs) == 1
    assert any(type(v) is TwoTensor for v in backend.example_inputs[0])
    ph = [n for n in backend.graphs[0].graph.nodes if n.op == "placeholder"]
    assert any(type(n.meta["example_value"]) is TwoTensor for n in ph)


def test_int8_weight_module_in_one_graph():
    class QLinear(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = torch.nn.Parameter(Int8Weight.quantize(w), requires_grad=False)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight).relu()

    m, x = QLinear(torch.randn(8, 16)), torch.randn(4, 16)
    backend = CountingBackend()
    torch.testing.assert_close(kiln_compile(m, backend=backend, fullgraph=True)(x), m(x))
    assert len(backend.graphs) == 1


def g(w, x):
    return x @ w.t() + 1


def test_type_and_metadata_are_guarded():
    backend = CountingBackend()
    compiled = kiln_compile(g, backend=backend, fullgraph=True)
    w, x = torch.randn(8, 16), torch.randn(4, 16)
    q0, q3 = Int8Weight.quantize(w), Int8Weight.quantize(w, zero=3)
    torch.testing.assert_close(compiled(q0, x), g(q0, x))
    torch.testing.assert_close(compiled(Int8Weight.quantize(2 * w), x), g(Int8Weight.quantize(2 * w), x))
    assert len(backend.graphs) == 1, "same type and metadata: the graph is reused"
    torch.testing.assert_close(compiled(q3, x), g(q3, x))  # zero point changed
    assert len(backend.graphs) == 2
    tw = TwoTensor(w, 2 * w)
    got = compiled(tw, x)
    assert_two_close(got, g(tw, x))  # another subclass type
    assert len(backend.graphs) == 3
    torch.testing.assert_close(compiled(q3, x), g(q3, x))
    torch.testing.assert_close(compiled(q0, x), g(q0, x))
    assert len(backend.graphs) == 3


def test_inner_tensor_is_guarded():
    backend = CountingBackend()
    compiled = kiln_compile(g, backend=backend, fullgraph=True)
    w, x = torch.randn(8, 16), torch.randn(4, 16)
    q = Int8Weight.quantize(w)
    torch.testing.assert_close(compiled(q, x), g(q, x))
    # the same outer tensor, but its payload is a transposed view now: recompiles
    qt = Int8Weight(q.qdata.t().contiguous().t(), q.scale)
    assert qt.stride() == q.stride() and qt.qdata.stride() != q.qdata.stride()
    torch.testing.assert_close(compiled(qt, x), g(qt, x))
    assert len(backend.graphs) == 2


class LoggedTwo(TwoTensor):
    """A traceable layout, but ``__torch_function__`` runs Python code on every call."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        LoggedTwo.calls += 1
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_torch_function_subclass_is_a_clean_break():
    x, y = LoggedTwo(torch.randn(3, 4), torch.randn(3, 4)), torch.randn(3, 4)
    with pytest.raises(Unsupported, match=r"L\['x'\] is a LoggedTwo, a tensor subclass"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(x, y)
    backend = CountingBackend()
    LoggedTwo.calls = 0
    got = kiln_compile(f, backend=backend)(x, y)
    assert LoggedTwo.calls > 0, "its __torch_function__ ran (eagerly)"
    expected = f(x, y)
    torch.testing.assert_close(got.a, expected.a)
    torch.testing.assert_close(got.b, expected.b)
    for inputs in backend.example_inputs:
        assert not any(isinstance(v, TwoTensor) for v in inputs)


@pytest.fixture(scope="module")
def mesh():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    from torch.distributed.device_mesh import init_device_mesh

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield init_device_mesh("cpu", (1,))
    if owned:
        dist.destroy_process_group()


def test_dtensor_api_in_one_graph_with_placements_guarded(mesh):
    """DTensor.from_local, .redistribute, .to_local and .placements inside the frame: one
    graph whose nodes take only tensors (mesh and placements baked into the targets); the
    placements are guarded constants, so other placements recompile."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def h(x, placements):
        d = DTensor.from_local(x, mesh, placements, run_check=False)
        y = (d * 2).redistribute(mesh, [Replicate()], async_op=True)
        return y.to_local() + len(y.placements)

    backend = CountingBackend()
    compiled = kiln_compile(h, backend=backend, fullgraph=True)
    x = torch.randn(4, 3)
    for placements in ([Shard(0)], [Shard(0)], [Replicate()]):
        got = compiled(x, placements)
        assert type(got) is torch.Tensor
        torch.testing.assert_close(got, h(x, placements))
    assert len(backend.graphs) == 2, "the same placements reuse the graph, others recompile"
    for gm in backend.graphs:
        dtensor_calls = [n for n in gm.graph.nodes if n.op == "call_function"
                         and getattr(n.target, "__name__", "").startswith("DTensor_")]
        assert [n.target.__name__.rsplit("_", 1)[0] for n in dtensor_calls] == [
            "DTensor_from_local", "DTensor_redistribute", "DTensor_to_local"]
        assert all(isinstance(a, torch.fx.Node) for n in dtensor_calls for a in n.args)
