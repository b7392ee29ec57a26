"""loopir's norms, scans, scatter_reduce/index_reduce, adaptive pooling, pointwise specials and
Welford var/mean through the C++ codegen against eager (loopir's own tests check them through
its interpreter; these moved here so that loopir's tests need no codegen)."""

from __future__ import annotations

import math
import warnings

import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx
from kiln_codegen_cpp.pipeline import KilnFallbackWarning, compile_schedule
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx


def _cpp(fn, *args, lowered, atol=None, rtol=None):
    """Compile ``fn`` through loopir and the C++ codegen, compare with eager, and check that
    none of the ``lowered`` ops took loopir's aten fallback."""
    K.counters.clear()
    compiled = compile_fx(torch.fx.symbolic_trace(fn), list(args))
    out = compiled(*args)
    ref = torch.utils._pytree.tree_leaves(fn(*args))
    assert len(out) == len(ref)
    kw = {} if atol is None else dict(atol=atol, rtol=rtol)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, **kw)
    fell_back = {op: n for op, n in K.counters["aten_fallbacks"].items() if op in lowered}
    assert not fell_back, fell_back


def test_cpp_norms_and_scans():
    x = torch.randn(6, 9)
    x[2, 2] = float("nan")
    _cpp(lambda x: (torch.linalg.vector_norm(x, 2, dim=1), torch.linalg.vector_norm(x, math.inf),
                    torch.linalg.vector_norm(x, 3.0, dim=0), torch.cumsum(x, 1), torch.cumprod(x, 0),
                    torch.cummax(x, 1), torch.cummin(x.half(), 0), torch.logcumsumexp(x, 1)),
         x, atol=1e-5, rtol=1e-5,
         lowered={"aten::linalg_vector_norm.default", "aten::cumsum.default", "aten::cummax.default",
                  "aten::cummin.default", "aten::logcumsumexp.default", "aten::cumprod.default"})


def test_cpp_scatter_reduce_pooling_specials():
    x = torch.randn(5, 6)
    idx = torch.tensor([[0, 1, 2, 0, 1, 3], [4, 0, 1, 2, 3, 4]])
    src = torch.randn(2, 6)
    xi = torch.randint(-9, 9, (5, 6))
    _cpp(lambda x, idx, src, xi: (torch.scatter_reduce(x, 0, idx, src, "amax", include_self=False),
                                  torch.scatter_reduce(x, 0, idx, src, "mean"),
                                  torch.scatter_reduce(xi, 0, idx, xi[:2], "mean", include_self=False),
                                  x.index_reduce(0, idx[0, :4], src.repeat(2, 1), "prod"),
                                  F.adaptive_avg_pool2d(x[None], (4, 4)),
                                  F.adaptive_max_pool2d(x[None], (2, 4), return_indices=True),
                                  torch.digamma(x * 4), torch.polygamma(1, x * 4)),
         x, idx, src, xi,
         lowered={"aten::scatter_reduce.two", "aten::index_reduce.default",
                  "aten::_adaptive_avg_pool2d.default", "aten::adaptive_max_pool2d.default",
                  "aten::digamma.default", "aten::polygamma.default"})


WELFORD = {
    "var": lambda x: x.var(1),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "std_mean_dim0": lambda x: torch.std_mean(x, 0, correction=0),
    "var_all": lambda x: x.var(),
    "var_keepdim_2dims": lambda x: x.view(5, 6, 20).var((0, 2), keepdim=True),
    "layer_norm": lambda x: F.layer_norm(x, (20,)),
}


@pytest.mark.parametrize("kind", sorted(WELFORD))
def test_welford_cpp(kind):
    """On large-mean data, where E[x^2] - E[x]^2 loses every digit of the variance."""
    fn = WELFORD[kind]
    torch.manual_seed(0)
    x = 1e4 + torch.randn(30, 20)
    functional = torch.func.functionalize(fn, remove="mutations_and_views")
    gm = make_fx(functional, decomposition_table=core_aten_decompositions())(x)
    sched = K.schedule(K.lower(gm, [x]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnFallbackWarning)
        compiled = compile_schedule(sched)
    assert "welford_m2 over" in "\n".join(k.source for k in compiled.module.kernels)
    ref = torch.utils._pytree.tree_leaves(fn(x))
    # layer_norm's x - mean itself carries fp32 rounding of 1e4 (1e-3), in eager as here
    tol = dict(atol=1e-2, rtol=1e-2) if kind == "layer_norm" else dict(atol=1e-3, rtol=1e-3)
    for a, b in zip(compiled(x), ref, strict=True):
        torch.testing.assert_close(a, b, **tol)
