"""A compiled graph whose output is an alias of an input (``x.detach()``, ``x[:]``,
``x.reshape(x.shape)``) returns a new tensor over the input's memory, as eager does: the
generated code drops the alias op and handed the input object itself back, so a
``requires_grad_()``, an in-place metadata change or a ``.grad`` on the result went to the
caller's tensor (``x.detach().requires_grad_()`` then backward twice accumulated into the
input's grad: a wrong gradient on the second call)."""

from __future__ import annotations

import kiln_frontend
import pytest
import torch

ALIASES = {
    "detach": lambda x: x.detach(),
    "slice": lambda x: x[:],
    "reshape": lambda x: x.reshape(x.shape),
    "view_as": lambda x: x.view_as(x),
    "with_compute": lambda x: (x.detach(), x + 1),
}


@pytest.mark.parametrize("name", list(ALIASES))
def test_alias_output_is_a_new_tensor(name, needs_cpp):
    fn = ALIASES[name]
    kiln_frontend.reset()
    compiled = kiln_frontend.compile(fn, backend="kiln")
    x = torch.randn(4)
    for _ in range(2):
        got = compiled(x)
        got = got[0] if isinstance(got, tuple) else got
        assert got is not x
        assert got.data_ptr() == x.data_ptr()  # the same memory, as eager's alias
        got.unsqueeze_(0)  # metadata of the result only
        assert x.shape == (4,)


def test_detached_input_made_leaf_gets_its_own_grad(needs_cpp):
    def f(x):
        x = x.detach().requires_grad_()
        y = (x * x).sum()
        y.backward()
        return x.grad

    kiln_frontend.reset()
    compiled = kiln_frontend.compile(f, backend="kiln")
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), 2 * x)
    assert not x.requires_grad and x.grad is None
