"""Traceable tensor subclasses through kiln end to end (C++ codegen): the subclass is
flattened at the graph boundary (kiln_aotgrad.subclasses), the ATen graph the codegen sees
holds plain tensors, outputs are wrapped back; training grads of subclass parameters and
inputs equal eager's; DTensor on a one-rank gloo mesh. docs/tensor-subclasses.md"""

from __future__ import annotations

import copy

import kiln
import kiln_aotgrad
import pytest
import torch
import torch.fx
from kiln.stats import counters
from kiln.testing import Int8WeightOnly, one_process_mesh
from kiln_aotgrad.subclasses import desugar_subclasses
from torch.testing._internal.two_tensor import TwoTensor


class QLinear(torch.nn.Module):
    def __init__(self, w, b):
        super().__init__()
        self.weight = torch.nn.Parameter(Int8WeightOnly.quantize(w), requires_grad=False)
        self.bias = torch.nn.Parameter(b, requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias).relu()


def _two(*shape, requires_grad=False):
    return TwoTensor(torch.randn(shape), torch.randn(shape)).requires_grad_(requires_grad)


def _close(got, expected):
    assert type(got) is type(expected)
    if isinstance(expected, TwoTensor):
        torch.testing.assert_close(got.a, expected.a)
        torch.testing.assert_close(got.b, expected.b)
    else:
        torch.testing.assert_close(got, expected)


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset_stats()
    yield


def test_two_tensor_compiles_with_kiln():
    def f(x, y):
        return (x * y).sin() + x.sum(0)

    x, y = _two(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        _close(kiln.compile(f, fullgraph=True)(x, y), f(x, y))
    assert counters["subclass_graphs"] == 1 and counters["graphs_compiled"] >= 1
    assert counters["eager_fallbacks"] == 0


def test_int8_weight_linear_keeps_int8_and_plain_aten():
    torch.manual_seed(0)
    m = QLinear(torch.randn(16, 32), torch.randn(16))
    x = torch.randn(4, 32)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(m, fullgraph=True)(x), m(x))
    assert counters["subclass_graphs"] == 1 and counters["eager_fallbacks"] == 0
    # the graph the codegen sees: plain tensors; the int8 payload is an input, not folded
    gm = torch.fx.symbolic_trace(m)
    d = desugar_subclasses(gm, [x])
    aten_gm = kiln_aotgrad.trace_inference(d.gm, d.example_inputs)
    vals = [n.meta["val"] for n in aten_gm.graph.nodes if "val" in n.meta
            and isinstance(n.meta["val"], torch.Tensor)]
    assert all(type(v).__name__ == "FakeTensor" for v in vals)
    assert torch.int8 in {n.meta["val"].dtype for n in aten_gm.graph.nodes
                          if n.op == "placeholder"}


class TwoNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(_two(4, 5))

    def forward(self, x):
        return (x @ self.w).tanh().sum()


@pytest.mark.parametrize("backend", ["kiln", "aot_eager"])
def test_training_grads_of_subclass_params_and_inputs(backend):
    torch.manual_seed(0)
    model = TwoNet()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    for _ in range(2):
        x = _two(3, 4, requires_grad=True)
        xr = TwoTensor(x.a.clone(), x.b.clone()).requires_grad_(True)
        loss, ref_loss = compiled(x), ref(xr)
        _close(loss, ref_loss)
        loss.backward()
        ref_loss.backward()
        _close(x.grad, xr.grad)
    _close(model.w.grad, ref.w.grad)
    assert counters["subclass_graphs"] >= 1 and counters["eager_fallbacks"] == 0
    if backend == "kiln":
        assert counters["backward_graphs_compiled"] >= 1


def test_plain_param_meeting_a_subclass_runs_eagerly_with_eager_grads():
    """Eager gives a plain parameter that meets a TwoTensor a TwoTensor grad; the plain
    graph cannot, so kiln runs that graph eagerly (logged, counted) and the grads match."""

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(_two(4, 4))
            self.b = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return (x @ self.w + self.b).relu().sum()

    torch.manual_seed(0)
    model = Mixed()
    ref = copy.deepcopy(model)
    x = _two(3, 4)
    kiln.compile(model, fullgraph=True)(x).backward()
    ref(x).backward()
    _close(model.b.grad, ref.b.grad)
    _close(model.w.grad, ref.w.grad)
    assert counters["eager_fallbacks"] == 1


@pytest.fixture(scope="module")
def mesh():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    with one_process_mesh() as mesh:
        yield mesh


class TPLinear(torch.nn.Module):
    """A tensor-parallel MLP with DTensor parameters: up sharded by output rows (column
    parallel), down by input columns (row parallel), as ColwiseParallel/RowwiseParallel
    lay them out."""

    def __init__(self, mesh):
        super().__init__()
        from torch.distributed.tensor import Shard, distribute_tensor

        up, down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)
        self.w1 = torch.nn.Parameter(distribute_tensor(up.weight.detach(), mesh, [Shard(0)]))
        self.b1 = torch.nn.Parameter(distribute_tensor(up.bias.detach(), mesh, [Shard(0)]))
        self.w2 = torch.nn.Parameter(distribute_tensor(down.weight.detach(), mesh, [Shard(1)]))

    def forward(self, x):
        h = torch.nn.functional.linear(x, self.w1, self.b1).relu()
        return torch.nn.functional.linear(h, self.w2)


@pytest.mark.parametrize("train", [False, True])
def test_dtensor_tensor_parallel_mlp_one_graph(mesh, train):
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    torch.manual_seed(0)
    model = TPLinear(mesh)
    ref = copy.deepcopy(model)
    x = distribute_tensor(torch.randn(4, 8), mesh, [Replicate()])
    compiled = kiln.compile(model, fullgraph=True)
    with torch.set_grad_enabled(train):
        out, expected = compiled(x), ref(x)
    assert type(out) is DTensor and out.placements == expected.placements
    torch.testing.assert_close(out.to_local(), expected.to_local())
    assert counters["subclass_graphs"] == 1 and counters["eager_fallbacks"] == 0
    if train:
        out.to_local().square().sum().backward()
        expected.to_local().square().sum().backward()
        for name in ("w1", "b1", "w2"):
            got, want = getattr(model, name).grad, getattr(ref, name).grad
            assert type(got) is DTensor
            torch.testing.assert_close(got.full_tensor(), want.full_tensor())


@pytest.mark.parametrize("train", [False, True])
def test_parallelize_module_one_graph_under_fullgraph(mesh, train):
    """parallelize_module's hooks (DTensor.from_local and redistribute in torch-internal
    lambdas) are traced into the graph: one graph under fullgraph=True, equal to eager, with
    grads of the DTensor parameters equal too (the multi-rank case, with collectives, is
    tests-integration/test_tensor_parallel.py)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    base = MLP()
    ref = parallelize_module(copy.deepcopy(base), mesh, plan)
    tp = parallelize_module(base, mesh, plan)
    x = torch.randn(4, 8)
    with torch.set_grad_enabled(train):
        got, expected = kiln.compile(tp, fullgraph=True)(x), ref(x)
    torch.testing.assert_close(got, expected)
    assert type(got) is torch.Tensor  # to_local() in RowwiseParallel's output hook
    assert counters["subclass_graphs"] == 1 and counters["eager_fallbacks"] == 0
    if train:
        got.square().sum().backward()
        expected.square().sum().backward()
        for (name, p), q in zip(tp.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad.full_tensor(), msg=name)


def test_training_programs_of_different_subclass_graphs_have_different_cache_keys():
    """A training graph over subclasses is one node running the original program: its name
    carries a hash of that program, so two programs with the same inputs never share an
    on-disk cache entry (the node's name is what the cache key reads of a call target)."""
    from kiln.cache import graph_key
    from kiln.options import Options

    def one(x):
        return (x * 2).tanh().sum()

    def two(x):
        return (x * 2).sin().sum()

    x = _two(3, 4, requires_grad=True)
    keys = []
    for fn in (one, two):
        d = desugar_subclasses(torch.fx.symbolic_trace(fn), [x])
        keys.append(graph_key(d.training_gm(), d.example_inputs, Options())[0])
    assert keys[0] != keys[1]
