"""``MyFunction.apply`` with grad mode on: one node (``autograd_function_apply``) whose forward
and backward are the user's own, traced as subgraphs; the gradients come from the user's
backward. once_differentiable and untraceable backwards break the graph naming the Function."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported
from kiln_frontend.symbolic.hops.autograd_function import autograd_function_apply

pytestmark = pytest.mark.usefixtures("fresh_frontend")

BIAS = torch.randn(5)


class Gate(torch.autograd.Function):
    """Saves an input and a computed tensor, keeps a constant and a tensor on ctx, returns a
    non-tensor too; its backward is deliberately not forward's derivative."""

    @staticmethod
    def forward(ctx, x, k):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        ctx.k = k
        ctx.scale = s.mean()
        return x * s * k, k + 1

    @staticmethod
    def backward(ctx, grad, _unused):
        x, s = ctx.saved_tensors
        return grad * (s + x) * ctx.k * 100 + ctx.scale + BIAS, None


def f(x):
    y, n = Gate.apply(x.sin(), 3)
    return y * n


def _grads(fn, x):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out.sum().backward()
    return out, x.grad


def test_apply_under_grad_is_one_node_and_uses_the_users_backward():
    backend = CountingBackend()
    x = torch.randn(5)
    out, grad = _grads(kiln_compile(f, backend=backend, fullgraph=True), x)
    ref_out, ref_grad = _grads(f, x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(grad, ref_grad)
    assert len(backend.graphs) == 1
    assert autograd_function_apply in backend.call_targets(0)
    gm = backend.graphs[0]
    bwd = [getattr(gm, n.target) for n in gm.graph.nodes
           if n.op == "get_attr" and n.target.startswith("autograd_bwd")]
    assert len(bwd) == 1 and "100" in bwd[0].code  # the user's backward, not autograd's


def test_an_input_that_needs_no_grad_gets_none_and_eager_results():
    def g(x, w):
        y, _ = Gate.apply(x * w, 2)
        return y

    x = torch.randn(5, requires_grad=True)
    w = torch.randn(5)  # no grad
    backend = CountingBackend()
    out = kiln_compile(g, backend=backend, fullgraph=True)(x, w)
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref = g(x2, w)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x2.grad)
    assert len(backend.graphs) == 1


class Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return grad * 2


class DataDependentBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        if grad.sum() > 0:  # a branch on tensor data: not traceable
            return grad * 2
        return grad * 3


@pytest.mark.parametrize("cls, reason", [(Once, "Once.backward is once_differentiable"),
                                         (DataDependentBackward,
                                          "DataDependentBackward.backward cannot be traced")])
def test_a_backward_that_cannot_be_captured_breaks_naming_it(cls, reason):
    def g(x):
        return cls.apply(x.sin()) + 1

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(Unsupported, match=reason):
        kiln_compile(g, backend=CountingBackend(), fullgraph=True)(x)
    out, grad = _grads(kiln_compile(g, backend=CountingBackend()), x)  # runs in Python there
    ref_out, ref_grad = _grads(g, x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(grad, ref_grad)


def test_a_constant_on_ctx_is_guarded():
    state = {"k": 2.0}

    def g(x):
        y, _ = Gate.apply(x, state["k"])
        return y

    backend = CountingBackend()
    compiled = kiln_compile(g, backend=backend, fullgraph=True)
    x = torch.randn(5)
    for k in (2.0, 4.0):
        state["k"] = k
        out, grad = _grads(compiled, x)
        ref_out, ref_grad = _grads(g, x)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(grad, ref_grad)
    assert len(backend.graphs) == 2
