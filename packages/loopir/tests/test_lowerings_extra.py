"""Lowerings of norms, scans, scatter_reduce/index_reduce, adaptive pooling and pointwise
specials (lowerings/norms.py, scans.py, scatter_reduce.py, resize.py, special.py): each checked
against eager through the interpreter for several dtypes (a few also through the C++ codegen:
codegen-cpp's test_loopir_lowerings_cpp.py); none may take the aten fallback."""

from __future__ import annotations

import math

import kiln_loopir as K
import pytest
import torch
import torch.nn.functional as F
from helpers import check

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8]


def _tol(dtype):
    return dict(atol=3e-2, rtol=3e-2) if dtype in (torch.float16, torch.bfloat16) else {}


def _no_fallback(*names):
    fb = K.counters["aten_fallbacks"]
    for n in names:
        assert not fb.get(n), f"{n} took the aten fallback: {dict(fb)}"


@pytest.fixture(autouse=True)
def _clear_counters():
    K.counters.clear()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, -1.5, math.inf, -math.inf])
def test_vector_norm(dtype, ord):
    x = torch.randn(4, 7).to(dtype)
    x[0, 0] = 0
    check(lambda x: (torch.linalg.vector_norm(x, ord, dim=1),
                     torch.linalg.vector_norm(x, ord, dim=(0, 1), keepdim=True),
                     torch.linalg.vector_norm(x, ord)), x, **_tol(dtype))
    _no_fallback("aten::linalg_vector_norm.default")


def test_vector_norm_dtype_arg_and_dist():
    x, y = torch.randn(3, 5), torch.randn(5)
    check(lambda x: torch.linalg.vector_norm(x.half(), 2, dim=0, dtype=torch.float64), x)
    check(lambda x, y: (torch.dist(x, y), torch.dist(x, y, 3), F.normalize(x, dim=1)), x, y,
          atol=1e-5, rtol=1e-5)
    _no_fallback("aten::linalg_vector_norm.default", "aten::dist.default")


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_scans(dtype):
    x = (torch.randn(5, 8) * 3).to(dtype) if dtype.is_floating_point else torch.randint(0, 4, (5, 8)).to(dtype)
    if dtype.is_floating_point:
        x[1, 3] = float("nan")
    tol = _tol(dtype)
    check(lambda x: (torch.cumsum(x, 1), torch.cumsum(x, 0), torch.cumprod(x, -1), torch.cummax(x, 1),
                     torch.cummin(x, 0)), x, **tol)
    if dtype.is_floating_point:
        check(lambda x: torch.logcumsumexp(x, 1), x, **tol)
        check(lambda x: torch.cumsum(x, 1, dtype=torch.float64), x, **tol)
    _no_fallback("aten::cumsum.default", "aten::cumprod.default", "aten::cummax.default",
                 "aten::cummin.default", "aten::logcumsumexp.default")


def test_scans_ties_infs_and_zero_dim():
    x = torch.tensor([[1.0, 3.0, 3.0, -math.inf, 3.0, math.inf, 2.0]])
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.logcumsumexp(x, 1)), x)
    check(lambda x: (torch.cumsum(x, 0), torch.cummax(x, 0), torch.logcumsumexp(x, 0)), torch.tensor(2.5))
    _no_fallback("aten::cummax.default", "aten::logcumsumexp.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    x = (torch.randn(5, 6) * 4).to(dtype)
    idx = torch.tensor([[0, 1, 2, 0, 1, 3], [4, 0, 1, 2, 3, 4], [0, 0, 0, 1, 1, 1]])
    src = (torch.randn(3, 6) * 4).to(dtype)

    def f(x, idx, src):
        return (torch.scatter_reduce(x, 0, idx, src, reduce, include_self=include_self),
                torch.scatter_reduce(x, 1, idx[:, :4].clamp(min=0), src, reduce, include_self=include_self))

    check(f, x, idx, src, **_tol(dtype))
    _no_fallback("aten::scatter_reduce.two")


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(dtype, reduce, include_self):
    x = (torch.randn(5, 6) * 4).to(dtype)
    i = torch.tensor([0, 2, 2, 4])

    def f(x, i, s0, s1, z, zs):
        return (x.index_reduce(0, i, s0, reduce, include_self=include_self),
                x.index_reduce(1, i, s1, reduce, include_self=include_self),
                z.index_reduce(0, i[:1], zs, reduce, include_self=include_self))

    args = (x, i, (torch.randn(4, 6) * 4).to(dtype), (torch.randn(5, 4) * 4).to(dtype),
            torch.tensor(2.5).to(dtype), torch.tensor(-1.5).to(dtype))
    check(f, *args, **_tol(dtype))
    _no_fallback("aten::index_reduce.default")


@pytest.mark.parametrize("dtype", FLOATS)
def test_adaptive_pooling_uneven(dtype):
    x = torch.randn(2, 3, 7, 9).to(dtype)
    y = torch.randn(2, 5, 6, 7).to(dtype)
    check(lambda x, y: (F.adaptive_avg_pool2d(x, (3, 4)), F.adaptive_avg_pool1d(x[0], 4),
                        F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
                        F.adaptive_max_pool1d(x[0], 5, return_indices=True),
                        F.adaptive_avg_pool3d(y, (2, 4, 3)),
                        F.adaptive_max_pool3d(y, (2, 4, 3), return_indices=True)), x, y, **_tol(dtype))
    _no_fallback("aten::_adaptive_avg_pool2d.default", "aten::_adaptive_avg_pool3d.default",
                 "aten::adaptive_max_pool2d.default", "aten::adaptive_max_pool3d.default")


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_pointwise_specials(dtype):
    x = (torch.randn(300) * 6).to(dtype)
    if dtype.is_floating_point:
        x[:9] = torch.tensor([0.0, -0.0, -3.0, 10.0, math.inf, -math.inf, math.nan, 1e-3, -2.5])
    e = torch.randint(-3, 4, (300,))
    check(lambda x, e: (torch.digamma(x), torch.polygamma(0, x), torch.polygamma(1, x),
                        torch.ldexp(x, e), torch.angle(x), torch.narrow_copy(x, 0, 5, 7)),
          x, e, **_tol(dtype))
    _no_fallback("aten::digamma.default", "aten::polygamma.default", "aten::ldexp.Tensor",
                 "aten::angle.default", "aten::narrow_copy.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("offset,dims", [(0, (0, 1)), (2, (0, 1)), (-1, (1, 0)), (1, (2, 0))])
def test_diagonal_scatter(dtype, offset, dims):
    x = (torch.randn(4, 5, 3) * 3).to(dtype)
    src = (torch.randn(4, 5, 3) * 3).to(dtype).diagonal(offset, *dims).contiguous()
    check(lambda x, s: torch.diagonal_scatter(x, s, offset, *dims), x, src)
    _no_fallback("aten::diagonal_scatter.default")
