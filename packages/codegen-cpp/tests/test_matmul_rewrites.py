"""Matrix products rewritten for CPU (issue 9): a 1x1 convolution over channels-last data runs
as ``mm`` on NHWC views, and a matmul's bias is added in the kernel of its elementwise
consumers instead of by ``addmm``. Every result is checked against eager and the loopir
interpreter (``run``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_pipeline import kernels, run


@pytest.fixture(autouse=True)
def _unpacked(monkeypatch):
    """These tests pin the ``mm``/``addmm`` rewrites; products on packed weights are
    ``test_packed_linear.py``'s."""
    from kiln_loopir.lowerings import extern

    monkeypatch.setattr(extern, "PACKED_LINEAR", False)


def _extern_ops(compiled) -> list[str]:
    return [str(s.kernel.op) for s in compiled.module.meta["schedule"].externs]


class _PointwiseConvs(torch.nn.Module):
    """ConvNeXt's MLP as convolutions: 3x3 conv, 1x1 up + GELU, 1x1 down + residual, then a
    bias-free 1x1 conv returned (its result read back NCHW)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.Conv2d(8, 16, 1)
        self.down = torch.nn.Conv2d(16, 8, 1)
        self.head = torch.nn.Conv2d(8, 4, 1, bias=False)

    def forward(self, x):
        y = self.stem(x)
        z = self.down(F.gelu(self.up(y))) + y
        return self.head(z)


def test_pointwise_convolutions_run_as_mm():
    torch.manual_seed(0)
    with torch.no_grad():
        c = run(_PointwiseConvs().eval(), torch.randn(2, 3, 7, 9), atol=1e-4, rtol=1e-4)
    ops = _extern_ops(c)
    assert ops.count("aten.convolution.default") == 1, ops  # the 3x3 stem only
    assert ops.count("aten.mm.default") == 3 and "aten.addmm.default" not in ops, ops
    # the biases of `up` and `down` are added in the GELU and residual kernels
    bodies = "\n".join(k.meta["body"] for k in kernels(c))
    assert "erf" in bodies


class _ConvThenConv(torch.nn.Module):
    """A 1x1 conv whose consumer is another convolution: the bias stays in the library call
    (addmm), and a 1x1 conv with stride 2 stays a convolution."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(4, 6, 1)
        self.b = torch.nn.Conv2d(6, 5, 3, padding=1)
        self.c = torch.nn.Conv2d(5, 3, 1, stride=2)

    def forward(self, x):
        return self.c(self.b(self.a(x.sin())))


def test_conv_feeding_conv_keeps_bias_in_addmm():
    torch.manual_seed(0)
    with torch.no_grad():
        c = run(_ConvThenConv().eval(), torch.randn(2, 4, 6, 6), atol=1e-4, rtol=1e-4)
    ops = _extern_ops(c)
    assert ops == ["aten.addmm.default", "aten.convolution.default",
                   "aten.convolution.default"], ops


class _ConvRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 1)

    def forward(self, x):
        return self.conv(x).relu()


def test_nchw_graph_input_keeps_the_convolution():
    """A graph input stored NCHW has no [N*H*W, C] view: the convolution extern runs."""
    torch.manual_seed(0)
    with torch.no_grad():
        c = run(_ConvRelu().eval(), torch.randn(2, 4, 5, 5), atol=1e-4, rtol=1e-4)
    assert _extern_ops(c) == ["aten.convolution.default"]


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.q = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = x + self.fc2(F.gelu(self.fc1(x)))
        return h, self.q(h)  # q's result is a graph output: addmm


def test_linear_bias_added_in_the_consumer_kernel():
    torch.manual_seed(0)
    with torch.no_grad():
        c = run(_Mlp().eval(), torch.randn(2, 5, 16), atol=1e-5, rtol=1e-5)
    ops = _extern_ops(c)
    assert ops.count("aten.mm.default") == 2 and ops.count("aten.addmm.default") == 1, ops


def test_half_bias_stays_in_addmm():
    """bfloat16: addmm rounds once, mm then add would round twice."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).to(torch.bfloat16).eval()
    with torch.no_grad():
        c = run(lin, torch.randn(4, 16, dtype=torch.bfloat16), atol=1e-2, rtol=1e-2)
    assert _extern_ops(c) == ["aten.addmm.default"]


@pytest.mark.parametrize("threads", [1, 2])
def test_rewrites_match_eager_across_threads(threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(1)
        with torch.no_grad():
            run(_PointwiseConvs().eval(), torch.randn(1, 3, 12, 5), atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(old)


def test_broadcast_bias_stays_in_addmm():
    """A bias of one element broadcast over the columns is not a per-column bias."""
    torch.manual_seed(0)

    def f(x, w, b):
        return torch.addmm(b, x, w).relu()

    c = run(f, torch.randn(6, 5), torch.randn(5, 7), torch.randn(1), atol=1e-5, rtol=1e-5)
    assert _extern_ops(c) == ["aten.addmm.default"]


def test_dynamic_rows_bias_in_the_consumer_kernel():
    torch.manual_seed(0)

    def f(x, w, b):
        return torch.addmm(b, x, w).relu()

    args = torch.randn(6, 5), torch.randn(5, 7), torch.randn(7)
    c = run(f, *args, dynamic=True, atol=1e-5, rtol=1e-5)
    assert _extern_ops(c) == ["aten.mm.default"]
    x = torch.randn(9, 5)
    torch.testing.assert_close(c(x, args[1], args[2])[0], f(x, args[1], args[2]))
