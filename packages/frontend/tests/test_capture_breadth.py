"""Capture breadth (issue 10): torch's own Python code inlined or one graph node through
``trace_rules``, and ordinary Python that used to break graphs.  Every case is compiled with
a backend that counts graphs and runs them as they are, and checked against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset, trace_rules
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def check(fn, *args, graphs=1, fullgraph=True):
    """``fn`` compiled agrees with eager and gives ``graphs`` graphs (at least one when
    ``graphs`` is None)."""
    backend = CountingBackend()
    expected = fn(*args)
    actual = kiln_compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    torch.testing.assert_close(actual, expected)
    if graphs is None:
        assert backend.graphs, "nothing was captured"
    else:
        assert len(backend.graphs) == graphs, [gm.code for gm in backend.graphs]
    return backend


# -- torch's own Python code -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["__rsub__", "__rdiv__", "__rtruediv__", "__rpow__",
                                  "__rmod__", "__rfloordiv__"])
def test_reflected_tensor_operator_is_one_graph(name):
    method = getattr(torch.Tensor, name)

    def f(x):
        return method(x, 3.0) + 1

    check(f, torch.rand(4) + 0.5)


def test_rmatmul():
    def f(x, w):
        return torch.Tensor.__rmatmul__(x, w).relu()

    check(f, torch.randn(3, 4), torch.randn(2, 3))


def test_signal_window_is_inlined():
    def f(x):
        return x * torch.signal.windows.hann(8, sym=False)

    check(f, torch.randn(8))


def test_masked_reduction_is_captured():
    def f(x, m):
        return torch.masked.sum(x, 1, mask=m) * 2

    x = torch.randn(3, 4)
    check(f, x, x > 0, graphs=None, fullgraph=False)


def test_private_aten_binding_is_a_graph_node():
    def f(x, y):
        return torch._chunk_cat([x, y], 0, 2).sin()

    check(f, torch.randn(4, 3), torch.randn(4, 5))


def test_functional_threshold_and_distance_loss():
    dist = nn.PairwiseDistance()

    def f(a, p, n):
        loss = F.triplet_margin_with_distance_loss(a, p, n, distance_function=dist)
        return F.threshold(a, 0.1, 20.0).sum() + loss

    check(f, torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3))


def test_trace_rules_refuse_duplicates_and_bad_frame_rules():
    with pytest.raises(ValueError, match="already registered"):
        trace_rules.register_module("torch.masked", trace_rules.Rule.INLINE, "again")
    with pytest.raises(ValueError, match="already registered"):
        trace_rules.register_function("torch.Tensor.__rsub__", trace_rules.Rule.GRAPH, "again")
    with pytest.raises(ValueError, match="captures_frames needs an INLINE rule"):
        trace_rules.register_module("torch.kiln_test_only", trace_rules.Rule.SKIP, "x",
                                    captures_frames=True)
    assert trace_rules.unresolved() == []
    assert trace_rules.lookup(torch.signal.windows.hann).rule is trace_rules.Rule.INLINE
    assert trace_rules.captures_frames_of(torch.masked._ops.__file__)
    assert not trace_rules.captures_frames_of(torch.nn.modules.linear.__file__)


# -- internal errors and constants met in transformers' T5 ---------------------------------

def test_inplace_operator_on_a_python_number():
    """``n = 0; n += t`` rebinds n; FX printed it as ``0 += t`` (a SyntaxError)."""

    def f(x):
        n = 0
        n += (x > 0).long() * 3
        m = 1.5
        m *= x
        return n + m

    check(f, torch.randn(5))


def test_finfo_is_a_constant():
    def f(x):
        lo = torch.finfo(x.dtype).min
        return torch.where(x > 0, x, lo), torch.iinfo(torch.int32).max + x

    check(f, torch.randn(5))


def test_module_children_in_a_captured_frame():
    """Was an internal error (``NNModuleVariable.children() missing ... 'tx'``)."""
    seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))

    def f(x):
        for child in seq.children():
            x = child(x)
        return x, len(list(seq.named_children()))

    check(f, torch.randn(2, 3))


def test_iterating_over_dict_list_and_tuple_iterators():
    table = {"a": 1.0, "b": 2.0}

    def f(x):
        it = iter(table.items())
        k, v = next(it)
        for key in iter(table):
            x = x + table[key]
        for a, b in zip(iter([1.0, 2.0]), iter((3.0, 4.0)), strict=True):
            x = x * a + b
        return x + v + len(k) + len([k2 for k2 in iter(table.keys())])

    check(f, torch.randn(3))



VALIDATORS = {list: 2.0, tuple: 3.0}


def test_dict_with_class_keys_is_guarded_per_item():
    """Dispatch tables keyed by classes (transformers' config validators): read in one graph;
    changing an item recompiles."""
    import typing

    table = {typing.Union: 1.0}

    def f(x):
        return x * VALIDATORS.get(list) + VALIDATORS[tuple] + table[typing.Union]

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2)), f(torch.ones(2)))
    VALIDATORS[list] = 5.0
    try:
        torch.testing.assert_close(compiled(torch.ones(2)), f(torch.ones(2)))
    finally:
        VALIDATORS[list] = 2.0
    assert len(backend.graphs) == 2


class _Optional(nn.Module):
    """``if self.down:`` on an optional submodule and ``if self.extra:`` on a container, as
    MobileViT and many timm blocks write them (each was a graph break)."""

    def __init__(self, down, extra):
        super().__init__()
        self.down, self.extra, self.fc = down, extra, nn.Linear(4, 4)

    def forward(self, x):
        if self.down:
            x = self.down(x)
        if self.extra:
            for m in self.extra:
                x = m(x)
        return self.fc(x)


@pytest.mark.parametrize("down, extra", [
    (nn.Linear(4, 4), nn.ModuleList()),
    (nn.Linear(4, 4), nn.ModuleList([nn.ReLU()])),
    (nn.Sequential(), nn.ModuleList([nn.Tanh()])),
])
def test_truth_value_of_a_module_is_one_graph(down, extra):
    reset()
    m, x = _Optional(down, extra), torch.randn(2, 4)
    backend = CountingBackend()
    torch.testing.assert_close(kiln_compile(m, backend=backend, fullgraph=True)(x), m(x))
    assert len(backend.graphs) == 1


def test_truth_value_of_a_container_follows_its_length():
    reset()
    m, x = _Optional(nn.Linear(4, 4), nn.ModuleList()), torch.randn(2, 4)
    compiled = kiln_compile(m, backend=CountingBackend(), fullgraph=True)
    compiled(x)
    m.extra.append(nn.Tanh())  # the container's structure is guarded: this recompiles
    torch.testing.assert_close(compiled(x), m(x))
