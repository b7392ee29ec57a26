"""float32 erf is the prelude's inline rational ``kiln_erf`` (vectorizes with no libm call;
GELU's erf): accurate to 5e-7 over the whole line, exact at +-inf, NaN kept."""

import torch
from cpp_test_utils import G, compile_sched
from kiln_loopir.virtualized import ops

F32 = torch.float32


def test_float_erf_is_the_inline_rational_and_accurate():
    x = torch.cat([torch.linspace(-8, 8, 40001), torch.logspace(-30, 0, 1001),
                   -torch.logspace(-30, 0, 1001),
                   torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0])])
    g = G(x)
    out = g.pointwise([x.numel()], lambda i: ops.erf(g.load(0, i)), F32)
    fn = compile_sched(g.schedule([out]))
    assert "kiln_erf(" in fn.module.kernels[0].meta["body"]
    (got,) = fn(x)
    ref = torch.erf(x.double())
    torch.testing.assert_close(got.double(), ref, rtol=5e-7, atol=5e-7, equal_nan=True)
    assert torch.equal(got[-5:-3], torch.tensor([1.0, -1.0])) and got[-3].isnan()
    assert got[-1].item() == 0.0 and torch.signbit(got[-1])  # erf(-0) = -0
