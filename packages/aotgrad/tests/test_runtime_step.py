"""The per-call path of ``compile_joint``'s callable (issue 28: small-batch training pays the
host time around the kernels): what it works out once per compiled graph instead of per call
stays correct at every call (outputs aliasing inputs, missing grads over static and symbolic
sizes), and a steady-state step runs few Python frames of the runtime."""

from __future__ import annotations

import copy
import sys

import torch
import torch.fx
import torch.nn as nn
from kiln_aotgrad import compile_joint
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                         nn.Linear(8, 8), nn.ReLU())


def _frames_of_one_step(compiled, x) -> list[str]:
    """The runtime's and torch's autograd.Function frames one forward+backward runs."""
    names: list[str] = []

    def profiler(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if path.endswith(("kiln_aotgrad/runtime.py", "torch/autograd/function.py")):
                names.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        compiled(x).sum().backward()
    finally:
        sys.setprofile(None)
    return names


def test_steady_state_step_runs_few_runtime_frames():
    # before the per-graph plan: 23 frames (the requires_grad pattern, the output structure's
    # pytree walk, the alias check of every output against every primal, list
    # comprehensions); now the call, torch's Function.apply, forward, backward and a few
    model = _mlp()
    x = torch.randn(4, 8)
    compiled = compile_joint(torch.fx.symbolic_trace(model), [x])
    for _ in range(2):
        compiled(x).sum().backward()
    names = _frames_of_one_step(compiled, x)
    assert len(names) <= 10, names
    assert "_is_input" not in names, names  # no output shares memory with an input


def test_output_that_is_an_input_is_a_fresh_tensor_at_every_call():
    def f(x, w):
        y = x * w
        return y, x, x.view(-1)

    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    compiled = compile_joint(torch.fx.symbolic_trace(f), [x, w])
    for step in range(3):
        x.grad = w.grad = None
        y, same, flat = compiled(x, w)
        assert same is not x and same.data_ptr() != x.data_ptr(), step
        assert flat.data_ptr() != x.data_ptr(), step
        (y.sum() + 2 * same.sum() + 3 * flat.sum()).backward()
        torch.testing.assert_close(x.grad, w.detach() + 5)
        torch.testing.assert_close(w.grad, x.detach())


def test_missing_grads_are_zeros_over_static_and_symbolic_sizes():
    def f(x, w):
        y = x * w
        return y.sin(), y.sum(dim=1)

    def check(compiled, sizes):
        for n in sizes:
            x = torch.randn(n, 3, requires_grad=True)
            w = torch.randn(n, 3, requires_grad=True)
            xr, wr = (t.detach().clone().requires_grad_() for t in (x, w))
            compiled(x, w)[1].sum().backward()  # the first output gets no grad
            f(xr, wr)[1].sum().backward()
            torch.testing.assert_close(x.grad, xr.grad)
            torch.testing.assert_close(w.grad, wr.grad)

    gm = torch.fx.symbolic_trace(f)
    example = [torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)]
    check(compile_joint(gm, example), [4, 4])

    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fakes = [mode.from_tensor(t, symbolic_context=context) for t in example]
    compiled = compile_joint(gm, fakes)
    assert compiled.compiled.joint.symbolic
    check(compiled, [4, 7, 2])


def test_mutation_epilogue_and_grads_match_eager_at_every_call():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    compiled = compile_joint(torch.fx.symbolic_trace(model), [torch.randn(6, 4)])
    for _ in range(3):
        x = torch.randn(6, 4)
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), (_, b) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
