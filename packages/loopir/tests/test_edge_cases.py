"""Odd layouts and sizes: scalars, empty tensors, strided/offset/expanded inputs, float64,
small integer types, complex (fallback)."""

from __future__ import annotations

import pytest
import torch
from helpers import check


def test_scalar_inputs_and_outputs():
    x = torch.tensor(2.5)
    y = torch.randn(3)
    check(lambda x, y: (x * 2, (y * x).sum(), x + y, y.max()), x, y)


def test_empty_tensors():
    x = torch.randn(0, 4)
    y = torch.randn(3, 0)
    check(lambda x, y: (x.sin(), x.sum(0), y.sum(1), y.prod(1), torch.cat([x, x]) * 2), x, y)


def test_noncontiguous_offset_expanded_inputs():
    base = torch.randn(6, 8)
    xt = base.t()  # transposed
    xo = base[1:, 2:]  # storage offset, strided
    xe = torch.randn(1, 6).expand(5, 6)  # stride 0
    check(lambda a, b, c: (a.cos() + 1, b * 2, c + b, (a.t()[1:, 2:] - b).abs().sum(1)), xt, xo, xe)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.uint8, torch.int16])
def test_other_dtypes(dtype):
    if dtype.is_floating_point:
        x = torch.randn(4, 5, dtype=dtype)
    else:
        x = torch.randint(0, 10, (4, 5)).to(dtype)
    check(lambda x: (x + x, x * 3, x.sum(1), x.amax(0), x > 4, x.to(torch.float32) / 3), x)


def test_complex_falls_back():
    from kiln_loopir import counters

    x = torch.randn(3, 4, dtype=torch.complex64)
    before = counters["aten_fallbacks"].get("aten::mul.Tensor", 0)
    check(lambda x: (x * x + 1, x.abs()), x)
    assert counters["aten_fallbacks"]["aten::mul.Tensor"] == before + 1


def test_bool_outputs_and_int_division():
    a = torch.randint(-9, 9, (4, 5))
    b = torch.randint(1, 5, (4, 5))
    check(lambda a, b: (a // b, a % b, torch.div(a, b, rounding_mode="trunc"), a / b,
                        torch.fmod(a, b), (a > 0) & (b > 2), a << 1, a >> 1), a, b)


def test_nan_inf_semantics():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("-inf"), 2.0, float("inf")]])
    check(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), torch.maximum(x, x.flip(1)),
                     x.clamp(0, 2), torch.nan_to_num(x), x.isnan(), torch.softmax(x, 1)), x)
