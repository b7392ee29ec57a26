"""Higher-order operators through the whole stack (``kiln.compile``, fullgraph=True): torch.cond
and while_loop compiled as one graph whose bodies are compiled by the same pipeline, an extern
call picking the branch at run time; gradients through cond; autograd.Function under grad mode
with the user's backward. C++ codegen, and Triton under TRITON_INTERPRET=1 where it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import kiln
import pytest
import torch
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


_TRITON = textwrap.dedent("""
    import torch, kiln
    from torch._higher_order_ops.while_loop import while_loop
    W = torch.randn(4, 4)
    def f(x, y):
        return torch.cond(x.sum() > 0, lambda a, b: (a @ W).sin() + b, lambda a, b: a.cos() * b,
                          (x, y)) * 2
    def g(i, x):
        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2 + 1), (i, x))
    cf = kiln.compile(f, fullgraph=True, options={"codegen": "triton"})
    cg = kiln.compile(g, fullgraph=True, options={"codegen": "triton"})
    y = torch.randn(4)
    for x in (torch.rand(4) + 0.1, -torch.rand(4) - 0.1):
        torch.testing.assert_close(cf(x, y), f(x, y))
    for start in (0, 7):
        torch.testing.assert_close(cg(torch.tensor(start), y), g(torch.tensor(start), y))
    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin() * 2
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * x * 100
    def h(x):
        return Gate.apply(x * 3).sum()
    ch = kiln.compile(h, fullgraph=True, options={"codegen": "triton"})
    a = torch.randn(6, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ch(a).backward()
    h(b).backward()
    torch.testing.assert_close(a.grad, b.grad)
    assert kiln.stats().eager_fallbacks == 0, kiln.stats()
    print("ok")
""")


def test_cond_while_loop_and_autograd_function_through_triton_interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "KILN_GRAPH_CACHE": "0"}
    run = subprocess.run([sys.executable, "-c", _TRITON], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]


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


def gate_fn(x, w):
    y, n = Gate.apply(x @ w, 3)
    return (y * n).relu()


def test_autograd_function_under_grad_trains_with_the_users_backward():
    kiln.reset()
    compiled = kiln.compile(gate_fn, fullgraph=True)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    for _ in range(2):
        x1, w1 = _fresh(x, w)
        x2, w2 = _fresh(x, w)
        out = compiled(x1, w1)
        out.sum().backward()
        ref = gate_fn(x2, w2)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x1.grad, x2.grad)
        torch.testing.assert_close(w1.grad, w2.grad)
    stats = kiln.stats()
    assert stats.training_graphs == 1 and stats.eager_fallbacks == 0


def test_autograd_function_under_grad_without_inputs_needing_grad_runs_inference():
    kiln.reset()
    compiled = kiln.compile(gate_fn, fullgraph=True)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(compiled(x, w), gate_fn(x, w))
    assert kiln.stats().eager_fallbacks == 0
