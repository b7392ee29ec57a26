"""Batch norm on CPU decomposes to torch's CPU kernel's arithmetic (issue 25): statistics
summed in float64, ``out = x * alpha + beta``. torch's own decomposition, ``(x - mean) * rstd
* w + b``, gives exactly 0 where ``x == mean`` while eager gives the rounding error of
``mean * alpha`` (its two FMAs), and a ReLU after the norm flips there."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from kiln_aotgrad.decompositions import core_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


class _ContractingInterpreter(torch.fx.Interpreter):
    """Runs an ATen graph as the C++ codegen compiles it: ``add(mul(a, b), c)`` is one FMA
    (GCC contracts it), emulated in float64 (the product of two floats is exact there)."""

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=False)  # the FMA reads the mul's inputs

    def run_node(self, n):
        if n.target is aten.add.Tensor and isinstance(n.args[0], torch.fx.Node) \
                and n.args[0].target is aten.mul.Tensor and len(n.args[0].users) == 1:
            a, b = (self.env[x] if isinstance(x, torch.fx.Node) else x for x in n.args[0].args)
            c = self.env[n.args[1]] if isinstance(n.args[1], torch.fx.Node) else n.args[1]
            dt = torch.result_type(a, b)
            return (torch.as_tensor(a).double() * torch.as_tensor(b).double()
                    + torch.as_tensor(c).double()).to(dt)
        return super().run_node(n)


def _decomposed(op, *args):
    return make_fx(lambda *a: op(*a), decomposition_table=core_decompositions())(*args)


def _tie_input():
    """Channel 0 holds 0.3 - d, 0.3, 0.3 + d (d exact): its mean is 0.3 bitwise."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    m = torch.tensor(0.3)
    d = torch.tensor([0.25, 0.5, 1.0, 2.0, 0.125] * 4).reshape(4, 5)
    x[0, 0], x[1, 0] = m + d, m - d
    x[0, 0, 0, 0] = x[1, 0, 0, 0] = m  # the tie: x == mean
    return x


@pytest.mark.parametrize("shape", [(2, 16, 56, 56), (2, 24, 7, 7), (3, 16, 33, 31)])
def test_training_statistics_match_eager_bitwise(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1.5
    c = shape[1]
    w, b = torch.randn(c), torch.randn(c)
    args = (x, w, b, torch.zeros(c), torch.ones(c), True, 0.1, 1e-5)
    want = aten._native_batch_norm_legit_functional.default(*args)
    got = _ContractingInterpreter(_decomposed(aten._native_batch_norm_legit_functional.default,
                                              *args)).run(*args)
    for k in (1, 2):  # save_mean, save_invstd
        assert torch.equal(got[k], want[k]), k
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
    for k in (3, 4):  # running statistics
        torch.testing.assert_close(got[k], want[k])


@pytest.mark.parametrize("training", [True, False])
def test_tie_gives_eager_value(training):
    x = _tie_input()
    w, b = torch.tensor([1.0, 0.7, 1.3]), torch.zeros(3)
    rm, rv = torch.tensor([0.3, 0.1, -0.2]), torch.tensor([1.7, 0.9, 1.1])
    args = (x, w, b, rm, rv, training, 0.1, 1e-5)
    want = aten.native_batch_norm.default(*args)[0]
    if training:  # the tie is real: eager's output there is the rounding error, not 0
        assert want[0, 0, 0, 0] != 0
    gm = _decomposed(aten.native_batch_norm.default, *args)
    got = _ContractingInterpreter(gm).run(*args)[0]
    assert torch.equal(got, want)
    from torch._decomp import decomposition_table

    if not training:  # torch's decomposition: exactly 0 at x == running_mean
        assert want[0, 0, 0, 0] != 0
        torch_gm = make_fx(lambda *a: decomposition_table[aten.native_batch_norm.default](*a))(*args)
        assert _ContractingInterpreter(torch_gm).run(*args)[0][0, 0, 0, 0] == 0


def test_other_devices_and_dtypes_keep_torch_decomposition():
    x = torch.randn(2, 3, 4, 4, dtype=torch.bfloat16)
    args = (x, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
    gm = _decomposed(aten.native_batch_norm.default, *args)
    assert not any(n.target is aten.sum.dim_IntList and n.kwargs.get("dtype") == torch.float64
                   for n in gm.graph.nodes)
    torch.testing.assert_close(gm(*args)[0], aten.native_batch_norm.default(*args)[0],
                               rtol=2e-2, atol=2e-2)
