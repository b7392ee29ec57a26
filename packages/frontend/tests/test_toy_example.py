"""DESIGN.md's seed example: ``toy_example`` gives exactly three graphs, guards on ``a``, ``b``
and the global ``torch``, and ``nopython=True`` points at the ``if`` line."""

from __future__ import annotations

import inspect
import operator
import pathlib

import _capture_harness as harness
import pytest
import torch
from kiln_frontend.exc import Unsupported
from kiln_frontend.guards import GuardKind


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


IF_LINE = inspect.getsourcelines(toy_example)[1] + 2


def _inputs(n=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        a = torch.randn(10, generator=g)
        b = torch.randn(10, generator=g)
        # make sure both signs of b.sum() occur
        b = b.abs() if i % 2 == 0 else -b.abs()
        out.append((a, b))
    return out


def _calls(gm):
    return [(n.op, n.target) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")]


def test_three_graphs_over_100_calls():
    backend = harness.Backend()
    cap = harness.Capture(backend)
    for a, b in _inputs():
        torch.testing.assert_close(cap(toy_example, a, b), toy_example(a, b))
    assert len(backend.graphs) == 3
    g1, g2, g3 = backend.graphs
    assert _calls(g1) == [
        ("call_function", torch.abs),
        ("call_function", operator.add),
        ("call_function", operator.truediv),
        ("call_method", "sum"),
        ("call_function", operator.lt),
    ]
    # the first call has b.sum() >= 0... or not: find the negative branch by its nodes
    branches = sorted([_calls(g2), _calls(g3)], key=len)
    assert branches[0] == [("call_function", operator.mul)]
    assert branches[1] == [("call_function", operator.mul), ("call_function", operator.mul)]
    neg = g2 if len(_calls(g2)) == 2 else g3
    first_mul = next(n for n in neg.graph.nodes if n.target is operator.mul)
    assert first_mul.args[1] == -1
    # three frames captured: toy_example and its two resume functions
    assert len(cap.frames) == 3
    names = [cf.code.co_name for cf in cap.frames]
    assert names[0] == "toy_example"
    assert all(n.startswith("__resume_at_") for n in names[1:])


def test_example_values_are_fake_and_inputs_real():
    backend = harness.Backend()
    cap = harness.Capture(backend)
    a, b = torch.randn(10), torch.randn(10)
    cap(toy_example, a, b)
    ex = backend.example_inputs[0]
    assert ex[0] is a and ex[1] is b
    from torch._subclasses.fake_tensor import FakeTensor

    for node in backend.graphs[0].graph.nodes:
        if node.op != "output":
            assert isinstance(node.meta["example_value"], FakeTensor), node


def test_first_graph_guards():
    cap = harness.Capture(harness.Backend())
    a, b = torch.randn(10), torch.randn(10)
    cap(toy_example, a, b)
    first = next(cf for cf in cap.frames if cf.code.co_name == "toy_example")
    kinds = {(g.source.name() if g.source else None, g.kind) for g in first.guards}
    assert ("L['a']", GuardKind.TENSOR_MATCH) in kinds
    assert ("L['b']", GuardKind.TENSOR_MATCH) in kinds
    assert ("G['torch']", GuardKind.FUNCTION_MATCH) in kinds
    printed = [str(g) for g in first.guards]
    assert " - local 'a' TENSOR_MATCH" in printed
    assert " - local 'b' TENSOR_MATCH" in printed
    assert " - global 'torch' FUNCTION_MATCH" in printed
    check = first.check_fn
    assert check(a, b)
    assert not check(torch.randn(11), b)
    assert check.failure_reason(torch.randn(11), b) == (
        "tensor L['a'] size mismatch at index 0: expected 10, actual 11")
    assert not check(a, b.double())
    assert "dtype" in check.failure_reason(a, b.double())


def test_nopython_points_at_the_if_line():
    cap = harness.Capture(harness.Backend(), nopython=True)
    with pytest.raises(Unsupported) as info:
        cap(toy_example, torch.randn(10), torch.randn(10))
    msg = str(info.value)
    assert msg.startswith(f"{__file__}:{IF_LINE}: ")
    assert "data-dependent branch on a tensor" in msg
    assert "(if b.sum() < 0)" in msg
    assert info.value.lineno == IF_LINE


def test_transformed_code_calls_compiled_fn_and_resume_functions():
    cap = harness.Capture(harness.Backend())
    cap(toy_example, torch.randn(10), torch.randn(10))
    cf = cap.frames[0]
    names = cf.code.co_names
    assert any(n.startswith("__compiled_fn_") for n in names)
    assert sum(1 for n in names if n.startswith("__resume_at_")) == 2
    # installed in the function's globals
    for n in names:
        if n.startswith("__"):
            assert n in toy_example.__globals__


def _hook_available() -> bool:
    try:
        from kiln_frontend import (
            _evalframe,  # noqa: F401
            eval_frame,  # noqa: F401
        )
    except (ImportError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not _hook_available(), reason="kiln_frontend._evalframe not built")
def test_toy_example_through_optimize():
    import kiln_frontend

    kiln_frontend.reset()
    backend = harness.Backend()
    opt = kiln_frontend.optimize(backend)(toy_example)
    try:
        for a, b in _inputs():
            torch.testing.assert_close(opt(a, b), toy_example(a, b))
    finally:
        kiln_frontend.reset()
    assert len(backend.graphs) == 3


@pytest.mark.skipif(not _hook_available(), reason="kiln_frontend._evalframe not built")
def test_toy_example_nopython_through_optimize():
    import kiln_frontend

    kiln_frontend.reset()
    opt = kiln_frontend.optimize(harness.Backend(), nopython=True)(toy_example)
    try:
        with pytest.raises(Unsupported, match=rf"{pathlib.Path(__file__).name}:{IF_LINE}: "):
            opt(torch.randn(10), torch.randn(10))
    finally:
        kiln_frontend.reset()
