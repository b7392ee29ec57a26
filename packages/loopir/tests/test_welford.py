"""Welford var/mean (reduction types welford_mean / welford_m2): the printed IR and the
interpreter against eager, on large-mean data where the one-pass sum-of-squares formula
(E[x^2] - E[x]^2) loses every digit of the variance (the C++ codegen on the same data:
codegen-cpp's test_loopir_lowerings_cpp.py)."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
from helpers import aten_graph, check

STATS = {
    "var": lambda x: x.var(1),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "std_mean_dim0": lambda x: torch.std_mean(x, 0, correction=0),
    "var_all": lambda x: x.var(),
    "var_keepdim_2dims": lambda x: x.view(5, 6, 20).var((0, 2), keepdim=True),
}


def _large_mean():
    torch.manual_seed(0)
    return 1e4 + torch.randn(30, 20)


def test_sum_of_squares_would_fail_on_this_data():
    x = _large_mean()
    naive = ((x * x).mean(1) - x.mean(1) ** 2) * 20 / 19
    assert not torch.allclose(naive, x.var(1), atol=1e-2, rtol=1e-2)


def test_var_mean_prints_welford_reductions_over_one_value():
    x = _large_mean()
    text = str(K.lower(aten_graph(lambda x: torch.var_mean(x, 1), x)))
    assert "Reduction welford_m2 ranges [30] reduction_ranges [20]" in text
    assert "Reduction welford_mean ranges [30] reduction_ranges [20]" in text
    assert "ops.reduction(float32, float32, welford_m2, tmp0)" in text


@pytest.mark.parametrize("kind", sorted(STATS))
def test_welford_interpreter(kind):
    check(STATS[kind], _large_mean(), atol=1e-3, rtol=1e-3)


def test_welford_empty_rows_and_half():
    check(lambda x: torch.var_mean(x, 1), torch.randn(3, 0))
    check(lambda x: torch.var_mean(x, 0), (100 + torch.randn(40, 3)).half(), atol=2e-2, rtol=2e-2)
