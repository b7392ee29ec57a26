"""Rows read through ``r // c`` and ``r % c`` loop over their parts in the C++ kernel
(``kiln_loopir.kernel_plan.split_inner_ranges``): Swin's patch merging gathers a 2x2
neighbourhood into one 4*C row and normalizes it, and its LayerNorm's loads divided and took
remainders of the row position for every element (the slowest kernels of Swin-tiny)."""

from __future__ import annotations

import kiln_aotgrad
import kiln_codegen_cpp.codegen as cpp_codegen
import kiln_loopir
import pytest
import torch
import torch.nn as nn
from kiln_codegen_cpp import compile_schedule
from kiln_loopir.ir import FusedGroup
from kiln_loopir.kernel_plan import split_inner_ranges


class PatchMerging(nn.Module):
    """timm's Swin v1 patch merging: 2x2 neighbours into channels, LayerNorm, Linear."""

    def __init__(self, c=24):
        super().__init__()
        self.norm = nn.LayerNorm(4 * c)
        self.reduction = nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x):
        b, h, w, c = x.shape
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


def _schedule(m, x):
    gm = torch.fx.symbolic_trace(m)
    with torch.no_grad():
        return kiln_loopir.schedule(kiln_loopir.lower(kiln_aotgrad.trace_inference(gm, [x])))


def _norm_group(sched):
    (g,) = [s for s in sched.steps if isinstance(s, FusedGroup)
            and any(n.kind == "reduction" for n in s.nodes)]
    return g


def test_patch_merging_rows_split_and_match_eager():
    torch.manual_seed(0)
    m, x = PatchMerging().eval(), torch.randn(2, 8, 12, 24)
    sched = _schedule(m, x)
    g = _norm_group(sched)
    split = split_inner_ranges(g)
    assert split is not g
    assert all(n.inner == [2, 2, 24] for n in split.nodes if n.inner), [n.inner for n in split.nodes]
    kernel = [k for k in compile_schedule(sched).module.kernels if k.group is g][0]
    assert "/ 48" not in kernel.meta["body"] and "% 24" not in kernel.meta["body"], kernel.meta["body"]
    with torch.no_grad():
        (got,) = compile_schedule(sched)(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", ["plain", "argmax", "short"])
def test_rows_that_do_not_split(rows):
    """A contiguous row, an argmax (its result is a position along the row) and a part
    shorter than 16 stay one loop; results match eager either way."""
    torch.manual_seed(0)
    fn = {
        "plain": lambda x: torch.softmax(x, -1),
        "argmax": lambda x: x.reshape(2, 4, 2, 5, 32).permute(0, 1, 3, 2, 4).flatten(2).argmax(-1),
        "short": lambda x: x.reshape(2, 4, 2, 5, 32)[..., :8].permute(0, 1, 3, 2, 4).flatten(2).sum(-1),
    }[rows]
    x = torch.randn(2, 8, 5, 32)

    class M(nn.Module):
        def forward(self, x):
            return fn(x)

    sched = _schedule(M(), x)
    for g in [s for s in sched.steps if isinstance(s, FusedGroup)]:
        assert split_inner_ranges(g) is g
    (got,) = compile_schedule(sched)(x)
    torch.testing.assert_close(got, fn(x))


def test_split_off_matches_split_on(monkeypatch):
    torch.manual_seed(0)
    m, x = PatchMerging(32).eval(), torch.randn(1, 6, 6, 32)
    with torch.no_grad():
        on = compile_schedule(_schedule(m, x))(x)[0]
        monkeypatch.setattr(cpp_codegen, "SPLIT_INNER_RANGES", False)
        off = compile_schedule(_schedule(m, x))(x)[0]
        torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(on, m(x), rtol=1e-4, atol=1e-4)
