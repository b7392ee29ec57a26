"""A cat along the innermost dim that an extern call reads writes each part into its slice.

Regression (issue 12): a transformer block's backward concatenates the q, k and v grads into
one row of ``3 d`` for the qkv weight's matmul. As one ``where`` chain over the row, every
element loaded all three parts through clamped indices; one loop per part copies each part
once, contiguously. A cat that only elementwise ops read stays one chain (it fuses into them),
and so does a cat along an outer dim or of short rows."""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# loopir's test helpers (trace, lower, schedule, interpret, compare with eager)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "loopir" / "tests"))

import pytest
import torch
from helpers import check
from kiln_loopir.ir import ComputedBuffer, ScatterBuffer

B, T, H, D = 2, 8, 4, 16


def _slices(graph) -> int:
    return len([b for b in graph.buffers if isinstance(b, ScatterBuffer)])


def qkv_grad_like(gq, gk, gv, x):
    """Three [b, h, t, d] grads, back to [b, t, h*d] rows, concatenated, into a matmul."""
    rows = [g.transpose(1, 2).reshape(B, T, H * D) for g in (gq, gk, gv)]
    cat = torch.cat(rows, -1).view(B * T, 3 * H * D)
    return cat.t() @ x, cat.sum(0)


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(B, H, T, D) for _ in range(3)] + [torch.randn(B * T, 5)]


def test_cat_of_rows_into_a_matmul_writes_slices():
    _, graph = check(qkv_grad_like, *_inputs(), via="aotgrad", atol=1e-5)
    assert _slices(graph) == 2  # the first part owns the buffer, the others write into it


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: torch.cat([a, b], -1).sin(),  # only elementwise users: fuses into them
        lambda a, b: torch.cat([a, b], 0) @ torch.ones(32, 3),  # an outer dim
        lambda a, b: torch.cat([a[:, :8], b[:, :8]], -1) @ torch.ones(16, 3),  # rows of 8
    ],
    ids=["elementwise-users", "outer-dim", "short-rows"],
)
def test_other_cats_stay_one_loop(fn):
    torch.manual_seed(0)
    _, graph = check(fn, torch.randn(4, 32), torch.randn(4, 32), via="aotgrad", atol=1e-5)
    assert _slices(graph) == 0
    assert len([b for b in graph.buffers if isinstance(b, ComputedBuffer)]) >= 1
