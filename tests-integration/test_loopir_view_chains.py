"""A chain of views of one loop (``mul.view(..).t()``) stays a view of the loop's buffer.

Regression (issue 12): in a linear layer's backward the grad of the activation is a loop
``g`` read as ``g.view(n, k)`` by one matmul (the input grad) and as ``g.view(n, k).t()`` by
another (the weight grad). The first realizes ``g``; the transposed view of the view was a
``GenericView`` of a view, so realizing it wrote a transposed copy (a kernel of strided stores)
instead of passing ``mm`` the buffer with transposed strides, as eager does."""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# loopir's test helpers (trace, lower, schedule, interpret, compare with eager)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "loopir" / "tests"))

import torch
from helpers import check
from kiln_loopir.ir import ComputedBuffer, ExternKernel, ReinterpretView
from kiln_loopir.sizevars import sympify

aten = torch.ops.aten


def linear_backward_like(x, w, g):
    h = (x * 2.0 + 1.0).view(8, 16)  # a loop, viewed
    grad_input = h @ w  # realizes the loop
    grad_weight = h.t() @ g  # a view of the view: the same buffer, transposed
    return grad_input, grad_weight


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(2, 4, 16), torch.randn(16, 8), torch.randn(8, 8)]


def test_transposed_view_of_a_view_is_passed_as_strides():
    args = _inputs()
    _, graph = check(linear_backward_like, *args, via="aotgrad")
    loops = [b for b in graph.buffers if isinstance(b, ComputedBuffer)]
    assert len(loops) == 1, loops  # the loop once; no transposed copy of it
    mms = [b for b in graph.buffers if isinstance(b, ExternKernel) and b.op is aten.mm.default]
    assert len(mms) == 2
    a = mms[1].inputs[0]
    assert isinstance(a, ReinterpretView) and a.data is loops[0], a
    assert [int(sympify(s)) for s in a.layout.stride] == [1, 16]


def test_slice_of_a_view_of_a_realized_loop_is_a_view():
    def split_after_matmul(x, w):
        h = (x + 1.0).view(8, 24)
        first = h @ w  # realizes the loop
        return first, h[:, 8:16].t() @ h[:, :8]  # slices of its view: views of the buffer

    torch.manual_seed(0)
    args = [torch.randn(2, 4, 24), torch.randn(24, 4)]
    _, graph = check(split_after_matmul, *args, via="aotgrad")
    assert len([b for b in graph.buffers if isinstance(b, ComputedBuffer)]) == 1
