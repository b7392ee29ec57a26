"""loopir on graphs that kiln_aotgrad traces: the core op set it may emit, and patterns whose
aotgrad graph differs from make_fx's. Here, not in loopir's tests: loopir does not depend on
aotgrad, and its own nox session installs loopir alone."""

from __future__ import annotations

import sys
from pathlib import Path

# loopir's test helpers (trace, lower, schedule, interpret, compare with eager)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "loopir" / "tests"))

import kiln_aotgrad.core_ops as core
import pytest
import torch
from helpers import check
from kiln_loopir import lowering as L
from kiln_loopir.lowerings import fallbacks as _declared  # noqa: F401  (registers everything)

aten = torch.ops.aten


def test_every_core_op_is_lowered_or_declared():
    """What an aotgrad graph may hold (its core op set) has a lowering or a declared
    fallback; the rest are handled by the graph walker itself (write-back copies, sizes)."""
    walker_handled = {aten.copy_.default, aten.sym_size.int, aten.sym_stride.int,
                      aten.sym_numel.default, aten.sym_storage_offset.default}
    missing = [str(op) for op in core.CORE_OPS
               if op not in L.lowerings and op not in L.fallbacks and op not in walker_handled]
    assert not missing


def test_as_strided_of_a_value_laid_out_unlike_eager():
    """as_strided addresses eager's storage: a value loopir realized with other strides than
    eager's is copied into eager's layout first."""
    def f(x):
        y = x.transpose(0, 1) * 2.0  # eager keeps y laid out like x (strides [1, 5])
        return torch.as_strided(y, [5, 4], [4, 1]) + 1.0

    check(f, torch.randn(4, 5), via="aotgrad")


def test_cat_of_many_inputs_channels_last():
    """The result keeps eager's (channels-last) layout; the slice loops index it."""
    xs = [torch.randn(2, 2 + k, 3, 3).contiguous(memory_format=torch.channels_last) for k in range(10)]
    check(lambda *xs: torch.cat(xs, 1).sin(), *xs, via="aotgrad")


def _make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(-3, 3, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g) * 6 - 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unfold(dtype):
    """``unfold`` (sliding windows) is a strided view: of an input, of a loop, of a transpose,
    a 0-d tensor, and one window as long as the dim."""
    x, y = _make((3, 10), dtype, seed=9), _make((), dtype, seed=10)
    check(lambda x, y: (x.unfold(1, 4, 2), x.unfold(0, 2, 1).clone(),
                        (x.t() if dtype == torch.bool else x.t() * 2).unfold(0, 3, 3),
                        x.unfold(-1, 10, 1), y.unfold(0, 1, 1)), x, y, via="aotgrad")
