"""Shortcuts the frontend takes where eager reads a value or an identity, and the checks
that take them back when the frame could tell: ``max()``/``min()`` over one-element tensors
chosen with ``torch.where`` (variables/tensor_select.py), ``t.data`` read as a ``detach``
(variables/tensor_data.py), ``requires_grad_()`` of an intermediate set on the graph's
output (translator.split_for_requires_grad), and a graph break inside nested grad-mode
blocks re-entering both (translator.break_reentering_with). Every result is compared with
eager's."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _run(fn, *args, fullgraph=False):
    backend = CountingBackend()
    out = kiln_compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    return out, len(backend.graphs)


def _same(actual, expected):
    torch.testing.assert_close(actual, expected, equal_nan=True)


# -- max()/min() over tensors --------------------------------------------------------------

def test_max_min_of_scalars_is_one_graph():
    def f(x):
        vals = [x.sum(), (x * 2).sum(), (x - 1).sum()]
        return max(vals), min(vals), max(vals[0], vals[2])

    x = torch.randn(4)
    out, graphs = _run(f, x, fullgraph=True)
    _same(out, f(x))
    assert graphs == 1


@pytest.mark.parametrize("nan_at", [0, 1, 2])
def test_max_min_keep_eagers_answer_with_nan(nan_at):
    # eager keeps the earlier item whenever a comparison with NaN is False
    # (torch.maximum would give NaN wherever one is)
    def f(x):
        vals = [x[0] + 0, x[1] + 0, x[2] + 0]
        return max(vals), min(vals)

    x = torch.tensor([1.0, 3.0, 2.0])
    x[nan_at] = float("nan")
    out, graphs = _run(f, x, fullgraph=True)
    _same(out, f(x))
    assert graphs == 1


def test_max_of_tensors_requiring_grad_leaves_the_others_without_grad():
    # where() would give the item not chosen a zero .grad; eager leaves it None
    def f(a, b):
        m = max(a * 1, b * 1)
        m.sum().backward()
        return m

    for va, vb in [(2.0, 2.0), (1.0, 3.0), (3.0, 1.0)]:
        a = torch.tensor([va], requires_grad=True)
        b = torch.tensor([vb], requires_grad=True)
        ea, eb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        expected = f(ea, eb)
        out, _ = _run(f, a, b)
        _same(out, expected)
        _same(a.grad, ea.grad)
        _same(b.grad, eb.grad)


def test_max_over_many_elements_breaks_and_raises_as_eager():
    def f(x):
        return max([x * 1, x * 2])

    with pytest.raises(RuntimeError, match="ambiguous"):
        f(torch.randn(4))
    with pytest.raises(RuntimeError, match="ambiguous"):
        _run(f, torch.randn(4))


def test_max_result_returned_with_its_items_keeps_identity():
    # eager's result IS one of the items: returning both makes the shortcut observable
    def f(x):
        vals = [x.sum(), (x * 2).sum()]
        return max(vals), vals

    x = torch.randn(4)
    (m, vals), graphs = _run(f, x)
    em, evals = f(x)
    _same(m, em)
    assert m is vals[[v is em for v in evals].index(True)]
    assert graphs >= 1


def test_max_result_identity_compared():
    def f(x):
        vals = [x.sum(), (x * 2).sum()]
        m = max(vals)
        return x * (1 if m is vals[0] else 2)

    for x in (torch.ones(4), -torch.ones(4)):
        out, _ = _run(f, x)
        _same(out, f(x))


def test_max_item_written_in_place_after_the_choice():
    def f(x):
        a, b = x.sum(), (x * 2).sum()
        m = max(a, b)
        a.add_(100)
        b.add_(100)
        return m + 0

    for x in (torch.ones(4), -torch.ones(4)):
        out, _ = _run(f, x)
        _same(out, f(x))


def test_max_of_input_views_breaks():
    def f(x):
        m = max(x[0], x[1])
        m.add_(10)  # writes into x in eager
        return x

    x = torch.tensor([1.0, 2.0])
    expected = f(x.clone())
    out, _ = _run(f, x.clone())
    _same(out, expected)


# -- requires_grad_() of an intermediate ---------------------------------------------------

def _as_leaf(v):
    return v.detach().requires_grad_()


def test_requires_grad_in_inlined_call_ends_the_graph_after_the_call():
    def f(x):
        w = _as_leaf(x * 2)
        out = w * 3
        return out, w, out.requires_grad, w.is_leaf, out.grad_fn is not None

    x = torch.randn(4)
    out, graphs = _run(f, x)
    expected = f(x)
    _same(out[0], expected[0])
    assert out[2:] == expected[2:]
    assert out[1].requires_grad and out[1].is_leaf
    out[0].sum().backward()
    _same(out[1].grad, torch.full((4,), 3.0))
    assert graphs == 2


def _leaf_used_inside(v):
    w = v.detach().requires_grad_()
    return w, w * 3


def test_requires_grad_then_used_in_the_same_call_breaks_at_the_call():
    def f(x):
        w, out = _leaf_used_inside(x * 2)
        return out, out.requires_grad

    x = torch.randn(4)
    out, _ = _run(f, x)
    expected = f(x)
    _same(out[0], expected[0])
    assert out[1] is True and out[0].requires_grad


# -- nested grad-mode blocks around a graph break ------------------------------------------

def test_break_inside_nested_grad_modes_re_enters_both():
    def f(x):
        with torch.no_grad():
            with torch.enable_grad():
                y = x * 2
                print("break")
                y = y + 1
            z = x * 3
        return y, z, y.requires_grad, z.requires_grad, torch.is_grad_enabled()

    x = torch.randn(4, requires_grad=True)
    out, graphs = _run(f, x)
    expected = f(x)
    _same(out[:2], expected[:2])
    assert out[2:] == expected[2:]
    assert graphs == 2


class _Boom(Exception):
    pass


def _explode():
    raise _Boom("inside")


def test_error_in_the_call_leaves_both_modes_as_eager():
    def f(x):
        with torch.no_grad():
            with torch.enable_grad():
                y = x * 2
                _explode()
        return y

    x = torch.randn(4, requires_grad=True)
    before = torch.is_grad_enabled()
    with pytest.raises(_Boom):
        _run(f, x)
    assert torch.is_grad_enabled() == before


def test_three_nested_modes_with_autocast():
    def f(x):
        with torch.enable_grad():
            with torch.no_grad():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = x @ x.T
                    print("break")
                    z = x @ x.T
        return y, z, torch.is_grad_enabled()

    x = torch.randn(4, 4, requires_grad=True)
    out, graphs = _run(f, x)
    expected = f(x)
    _same(out[:2], expected[:2])
    assert out[2] == expected[2]
    assert graphs == 2


# -- Tensor.data ---------------------------------------------------------------------------

def test_data_read_only_is_one_graph():
    def f(x):
        d = x.data
        return d * 2, d.requires_grad, d.is_leaf

    x = torch.randn(4, requires_grad=True)
    out, graphs = _run(f, x, fullgraph=True)
    expected = f(x)
    _same(out[0], expected[0])
    assert out[1:] == expected[1:] and not out[0].requires_grad
    assert graphs == 1


def test_data_of_parameter_under_grad_with_backward():
    lin = nn.Linear(4, 4)

    def f(x):
        scale = lin.weight.data.abs().mean()
        return (lin(x) * scale).sum()

    x = torch.randn(2, 4)
    expected = f(x)
    expected.backward()
    eg = lin.weight.grad.clone()
    lin.weight.grad = None
    out, graphs = _run(f, x, fullgraph=True)
    out.backward()
    _same(out, expected)
    _same(lin.weight.grad, eg)  # no gradient through .data
    assert graphs == 1


def test_write_through_data_of_input_lands_in_its_memory_without_autograd():
    def f(x, w):
        y = (x * w).sum()  # saves w for backward
        w.data.mul_(2)  # eager: autograd does not see it (w's version is unchanged)
        return y

    for compiled in (False, True):
        x = torch.randn(4, requires_grad=True)
        w = torch.ones(4, requires_grad=True)
        version = w._version
        fn = f if not compiled else kiln_compile(f, backend=CountingBackend())
        y = fn(x, w)
        _same(w.detach(), torch.full((4,), 2.0))
        assert w._version == version
        y.backward()  # no "modified by an inplace operation" error, as in eager
        _same(x.grad, torch.full((4,), 2.0))  # the new memory is read, as in eager


def test_write_through_data_of_parameter_is_seen():
    lin = nn.Linear(4, 4)

    def ema(x):
        lin.weight.data.mul_(0.5)
        return lin(x)

    x = torch.randn(2, 4)
    ref = nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())
    with torch.no_grad():
        ref.weight.mul_(0.5)
    expected = ref(x)
    out, _ = _run(ema, x)
    _same(out, expected)
    _same(lin.weight, ref.weight)
    with torch.no_grad():
        ref.weight.mul_(0.5)
    out, _ = _run(ema, x)  # a second call sees the first write
    _same(out, ref(x))


def test_data_alias_returned_keeps_its_own_version_counter():
    def f(x):
        return x.data

    x = torch.randn(4, requires_grad=True)
    d, _ = _run(f, x)
    version = x._version
    d.add_(1)
    assert x._version == version  # as eager's alias
    _same(x.detach(), d)


def test_data_taken_then_base_written():
    def f(x):
        d = x.data
        x.mul_(3)
        return d + 0

    x = torch.randn(4)
    expected = f(x.clone())
    out, _ = _run(f, x.clone())
    _same(out, expected)


def test_write_through_data_breaks_at_the_take_with_its_reason():
    # pinned: the graph cannot give the alias a version counter of its own, so a write
    # through .data runs in Python (the break is at the attribute read, named)
    from kiln_frontend import explain

    def f(x):
        y = x * 2
        x.data.add_(1)
        return y + x

    x = torch.randn(4)
    x_eager = x.clone()
    f(x_eager)
    report = explain(f)(x)
    _same(x, x_eager)  # the write landed in x's memory, as eager's
    reasons = [b.reason for b in report.break_reasons]
    assert any("Tensor.data" in r for r in reasons), reasons
    assert report.graph_count == 2, reasons
