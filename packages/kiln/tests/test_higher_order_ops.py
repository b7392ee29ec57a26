"""Higher-order operators through the whole stack (``kiln.compile``, fullgraph=True): torch.cond
and while_loop (map and scan too) compiled as one graph whose bodies are compiled by the same pipeline, an extern
call picking the branch at run time; gradients through cond; autograd.Function under grad mode
with the user's backward. C++ codegen; the same operators through Triton's interpreter:
test_higher_order_triton.py."""

from __future__ import annotations

import kiln
import pytest
import torch
from kiln_frontend.symbolic.hops.map_scan import SCAN_YS_ALONG_DIM
from torch._higher_order_ops.map import map as hmap
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

pytestmark = pytest.mark.usefixtures("needs_cpp")

W = torch.randn(4, 4)


def cond_fn(x, y):
    def true_fn(a, b):
        return (a @ W).sin() + b

    def false_fn(a, b):
        return a.cos() * b

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)) * 2


def _fresh(*ts):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]


def test_cond_inference_compiles_both_branches_and_picks_one_at_run_time():
    kiln.reset()
    compiled = kiln.compile(cond_fn, fullgraph=True)
    y = torch.randn(4)
    for x in (torch.rand(4) + 0.1, -torch.rand(4) - 0.1):
        torch.testing.assert_close(compiled(x, y), cond_fn(x, y))
    stats = kiln.stats()
    assert stats.graphs_compiled == 3  # the graph and its two branches
    assert stats.eager_fallbacks == 0


def test_gradients_flow_through_cond():
    kiln.reset()
    w = torch.randn(4, requires_grad=True)

    def f(x, y):
        return torch.cond(x.sum() > 0, lambda a, b: a.sin() * w + b, lambda a, b: a * b.cos(),
                          (x, y)).sum()

    compiled = kiln.compile(f, fullgraph=True)
    for sign in (1.0, -1.0):
        x = (sign * (torch.rand(4) + 0.1)).requires_grad_()
        y = torch.randn(4, requires_grad=True)
        x2, y2 = _fresh(x, y)
        out = compiled(x, y)
        out.backward()
        gw = w.grad
        w.grad = None
        ref = f(x2, y2)
        ref.backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x.grad, x2.grad)
        torch.testing.assert_close(y.grad, y2.grad)
        torch.testing.assert_close(gw, w.grad)  # a closed-over parameter: lifted, differentiated
        w.grad = None
    assert kiln.stats().training_graphs == 1
    assert kiln.stats().eager_fallbacks == 0


def test_while_loop_runs_compiled():
    kiln.reset()
    k = torch.tensor(0.5)

    def f(i, x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2 + k), (i, x))

    compiled = kiln.compile(f, fullgraph=True)
    x = torch.randn(3)
    for start in (0, 3, 7):  # 5, 2 and 0 iterations
        i = torch.tensor(start)
        torch.testing.assert_close(compiled(i, x), f(i, x))
    assert kiln.stats().graphs_compiled == 3
    assert kiln.stats().eager_fallbacks == 0


class Gate(torch.autograd.Function):
    """Saves tensors, keeps a constant on ctx, returns a non-tensor; its backward is not
    forward's derivative, so only the user's backward gives eager's gradients."""

    @staticmethod
    def forward(ctx, x, k):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        ctx.k = k
        return x * s * k, k + 1

    @staticmethod
    def backward(ctx, grad, _unused):
        x, s = ctx.saved_tensors
        return grad * (s + x) * ctx.k * 100, None


def _assert_trains_as_eager(compiled, fn, x, w):
    """One step on fresh copies of the leaves ``x`` and ``w``: ``compiled``'s output and the
    grads of both equal ``fn``'s in eager."""
    x1, w1 = _fresh(x, w)
    x2, w2 = _fresh(x, w)
    out = compiled(x1, w1)
    out.sum().backward()
    ref = fn(x2, w2)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def gate_fn(x, w):
    y, n = Gate.apply(x @ w, 3)
    return (y * n).relu()


def test_autograd_function_under_grad_trains_with_the_users_backward():
    kiln.reset()
    compiled = kiln.compile(gate_fn, fullgraph=True)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    for _ in range(2):
        _assert_trains_as_eager(compiled, gate_fn, x, w)
    stats = kiln.stats()
    assert stats.training_graphs == 1 and stats.eager_fallbacks == 0


def test_autograd_function_under_grad_without_inputs_needing_grad_runs_inference():
    kiln.reset()
    compiled = kiln.compile(gate_fn, fullgraph=True)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(compiled(x, w), gate_fn(x, w))
    assert kiln.stats().eager_fallbacks == 0


M = torch.randn(3, 3)


def map_fn(xs, b, w):
    return hmap(lambda x, b: (x @ w).sin() + b * M.sum(), xs, b) * 2


def scan_fn(init, xs, w):
    def combine(carry, x):
        c = carry[0] * 0.5 + (x @ w).tanh()
        return (c, carry[1] + x.sum()), (c * carry[1], c.exp())

    return scan(combine, init, xs, dim=1, reverse=True)


def scan_grad_fn(init, xs, w):
    def combine(carry, x):
        c = carry * 0.5 + (x @ w).tanh()
        return c, (c * x, c.exp())

    return scan(combine, init, xs, dim=1, reverse=True)


def _flat(out):
    return [t for o in out for t in _flat(o)] if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("which", ["map", "scan"])
def test_map_and_scan_compile_in_one_graph_with_eager_outputs_and_gradients(which):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 3, generator=g)
    if which == "map":
        fn, args = map_fn, (torch.randn(5, 3, generator=g), torch.randn(3, generator=g), w)
    else:
        fn, args = scan_fn, ((torch.randn(3, generator=g), torch.randn((), generator=g)),
                             torch.randn(3, 5, generator=g), w)
    whole = which == "map" or SCAN_YS_ALONG_DIM
    kiln.reset()
    compiled = kiln.compile(fn, fullgraph=whole)
    for a, b in zip(_flat(compiled(*args)), _flat(fn(*args)), strict=True):
        torch.testing.assert_close(a, b)
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0
    assert stats.graphs_compiled == 2 or not whole  # the graph and the body

    if which == "scan":
        fn, args = scan_grad_fn, (args[0][0], args[1], w)
        compiled = kiln.compile(fn, fullgraph=whole)
    leaves = [t.requires_grad_() for t in _flat(args)]
    out, ref = _flat(compiled(*args)), _flat(fn(*args))
    weights = [torch.randn(o.shape, generator=g) for o in ref]  # gradients that differ per step
    got = torch.autograd.grad(sum((o * k).sum() for o, k in zip(out, weights, strict=True)), leaves)
    want = torch.autograd.grad(sum((o * k).sum() for o, k in zip(ref, weights, strict=True)), leaves)
    for a, b in zip(out + list(got), ref + list(want), strict=True):
        torch.testing.assert_close(a, b)
    stats = kiln.stats()
    # scan: torch's own backward rule at times builds a forward combine graph returning one
    # tensor twice and then refuses it ("scan might be aliasing the input or the output!",
    # torch.compile's aot_eager too); the frame then runs eagerly, with eager's gradients
    assert stats.eager_fallbacks == 0 and (stats.training_graphs == 1 or which == "scan")


class NewStyleGate(torch.autograd.Function):
    """Gate written new-style: forward without ctx, setup_context saves (a tensor it computes
    too) and keeps the constant."""

    @staticmethod
    def forward(x, k):
        return x * torch.sigmoid(x) * k, k + 1

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, k = inputs
        ctx.save_for_backward(x, torch.sigmoid(x))
        ctx.k = k

    @staticmethod
    def backward(ctx, grad, _unused):
        x, s = ctx.saved_tensors
        return grad * (s + x) * ctx.k * 100, None


def test_new_style_autograd_function_under_grad_trains_with_the_users_backward():
    def f(x, w):
        y, n = NewStyleGate.apply(x @ w, 3)
        return (y * n).relu()

    kiln.reset()
    compiled = kiln.compile(f, fullgraph=True)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    _assert_trains_as_eager(compiled, f, x, w)
    stats = kiln.stats()
    assert stats.training_graphs == 1 and stats.eager_fallbacks == 0
