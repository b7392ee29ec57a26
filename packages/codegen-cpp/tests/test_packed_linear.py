"""Products with a constant float32 weight on CPU run on the weight packed once for MKL's
GEMM (``mkl._mkl_linear``; loopir's ``packed_linear``): linear layers and 1x1 convolutions.
The packed weight is a derived constant: guarded (an in-place write to the weight compiles
again) and made again from the live weight on a graph-cache hit."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
from test_pipeline import run

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="MKL's packed GEMM needs MKL")

MKL_LINEAR = "mkl._mkl_linear.default"


def _extern_ops(compiled) -> list[str]:
    return [str(s.kernel.op) for s in compiled.module.meta["schedule"].externs]


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 96)
        self.down = nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))), self.up(x).sum(-1)


def test_linear_layers_run_on_packed_weights_and_match_eager():
    torch.manual_seed(0)
    model = _Mlp().eval()
    with torch.no_grad():
        compiled = run(model, torch.randn(2, 5, 16), rtol=1e-5, atol=1e-5)
    ops = _extern_ops(compiled)
    assert ops.count(MKL_LINEAR) >= 2 and "aten.mm.default" not in ops, ops
    text = str(compiled.module.meta["schedule"])
    assert "mkl_packed_linear(" in text, text  # the derived constant prints its recipe


def test_a_weight_written_in_place_compiles_again():
    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        compiled = run(model, x, rtol=1e-5, atol=1e-5)
        model.up.weight.mul_(-1.0)  # the packed copy is stale now
        model.down.weight.add_(0.25)
        for got, want in zip(compiled(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pointwise_convolution_runs_on_a_packed_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 64, 1)).eval()
    with torch.no_grad():
        compiled = run(model, torch.randn(2, 3, 8, 8), rtol=1e-5, atol=1e-5)
    assert MKL_LINEAR in _extern_ops(compiled)


class _Conv1D(nn.Module):
    """GPT-2's ``Conv1D``: ``addmm(bias, x, W)`` with ``W[in, out]`` (not transposed)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 72))
        self.bias = nn.Parameter(torch.randn(72))

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, 16), self.weight)
        return y.view(x.shape[0], x.shape[1], 72).transpose(1, 2)  # not elementwise: addmm's bias


def test_an_in_out_weight_is_packed_transposed():
    torch.manual_seed(0)
    with torch.no_grad():
        compiled = run(_Conv1D().eval(), torch.randn(2, 5, 16), rtol=1e-5, atol=1e-5)
    assert _extern_ops(compiled) == [MKL_LINEAR]
    text = str(compiled.module.meta["schedule"])
    assert re.search(r"mkl_packed_linear\(const\d+, 10, True\)", text), text


def test_a_traced_weight_or_a_narrow_product_stays_on_mm():
    """Products whose weight is not a constant (an input), and products with fewer than
    ``PACKED_MIN_OUT_FEATURES`` outputs (where MKL's packed GEMM is slower), are ``mm``."""

    def f(x, w):
        return x @ w.t()

    compiled = run(f, torch.randn(4, 8), torch.randn(96, 8))
    assert _extern_ops(compiled) == ["aten.mm.default"]
    narrow = nn.Linear(16, 24, bias=False).eval()
    with torch.no_grad():
        compiled = run(narrow, torch.randn(4, 16), rtol=1e-5, atol=1e-5)
    assert _extern_ops(compiled) == ["aten.mm.default"]
