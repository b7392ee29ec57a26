"""``MyFunction.apply`` of a user's ``torch.autograd.Function``: inlined (its forward only)
while no gradient is recorded, so an inference graph stays whole; with grad mode on, the call
runs in Python and the gradients come from the user's own backward."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile


class ScaledGate(torch.autograd.Function):
    """Old style: forward(ctx, ...); saves, sets and reads ctx state."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.scale = 2.0
        ctx.mark_non_differentiable()
        return x * torch.sigmoid(1.702 * x) * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        return grad * 100  # not forward's derivative: the test can tell which one ran


class Times(torch.autograd.Function):
    """New style: forward(*args) and setup_context."""

    @staticmethod
    def forward(x, k):
        return x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k * 10, None


def f(x):
    return ScaledGate.apply(x.sin()) + Times.apply(x, 3.0)


pytestmark = pytest.mark.usefixtures("fresh_frontend")


def test_apply_without_grad_is_inlined_into_one_graph():
    backend = CountingBackend()
    x = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(kiln_compile(f, backend=backend, fullgraph=True)(x), f(x))
    assert len(backend.graphs) == 1


def test_apply_with_grad_keeps_the_users_backward():
    x, y = torch.randn(5, requires_grad=True), None
    y = x.detach().clone().requires_grad_()
    kiln_compile(f, backend=CountingBackend())(x).sum().backward()
    f(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_replacing_forward_recompiles():
    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend)
    x = torch.randn(5)
    original = Times.forward
    try:
        with torch.no_grad():
            compiled(x)
            Times.forward = staticmethod(lambda x, k: x - k)
            torch.testing.assert_close(compiled(x), f(x))
    finally:
        Times.forward = staticmethod(original)
