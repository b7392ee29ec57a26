"""Tensor subclasses that override torch's functions are never captured as plain tensors:
an input that is one is loadable but every use is a graph break (it runs eagerly, with the
subclass's own semantics); ``Parameter`` (both overrides disabled) is captured as before.
Before, kiln traced such a tensor as a plain one: a ``__torch_function__`` that changes a
result was ignored (a wrong answer, no warning), and results lost the subclass."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported


class Shifted(torch.Tensor):
    """add() gives 100 more than eager's add."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
            return out + 100 if func is torch.Tensor.add else out


class Tagged(torch.Tensor):
    """No override: Tensor's default __torch_function__ returns Tagged results."""


pytestmark = pytest.mark.usefixtures("fresh_frontend")


def f(t, y):
    z = y * 2  # plain work before the subclass is used: still captured
    return t.add(1) * z


@pytest.mark.parametrize("cls", [Shifted, Tagged])
def test_subclass_input_runs_eagerly_with_its_semantics(cls):
    t, y = torch.randn(3).as_subclass(cls), torch.randn(3)
    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend)
    for _ in range(2):
        got, expected = compiled(t, y), f(t, y)
        assert type(got) is type(expected)
        torch.testing.assert_close(got.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    assert backend.graphs, "the plain work before the subclass's use is still captured"
    for inputs in backend.example_inputs:
        assert all(type(x) in (torch.Tensor, torch.nn.Parameter)
                   for x in inputs if isinstance(x, torch.Tensor))


def test_subclass_input_under_fullgraph_names_it():
    with pytest.raises(Unsupported, match=r"L\['t'\] is a Shifted, a tensor subclass"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(
            torch.randn(3).as_subclass(Shifted), torch.randn(3))


def test_parameter_input_is_still_captured():
    backend = CountingBackend()
    p = torch.nn.Parameter(torch.randn(3))
    torch.testing.assert_close(kiln_compile(f, backend=backend)(p, torch.ones(3)), f(p, torch.ones(3)))
    assert len(backend.graphs) == 1
