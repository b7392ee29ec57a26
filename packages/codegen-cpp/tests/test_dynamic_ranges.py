"""Symbolic loop bounds that are sums (``-1 + s1``) keep their meaning in generated C++:
the vectorized reduction's end (`range - range % lanes`) once read past the row."""

import pytest
import torch
from kiln_codegen_cpp import compile_fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv


def _dynamic_example(shape):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    return mode.from_tensor(torch.randn(shape), static_shapes=False)


@pytest.mark.parametrize("width", [33, 40, 48, 64, 97])
def test_sum_over_a_sliced_dynamic_row(width):
    def f(x):
        return (x[:, 1:].sum(-1),)

    gm = torch.fx.symbolic_trace(f)
    fake = _dynamic_example((4, 40))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = fake
    compiled = compile_fx(gm, [fake])
    x = torch.randn(4, width)
    with torch.no_grad():
        got = compiled(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    torch.testing.assert_close(got, f(x)[0])
