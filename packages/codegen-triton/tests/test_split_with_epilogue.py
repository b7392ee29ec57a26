"""A split reduction whose group also holds per-output work (dynamic float8 scaling's
``448 / amax``): the first kernel reduces chunks of the row, the final kernel combines them
and runs the epilogue. Before, such a group ran the whole row in one program."""

from __future__ import annotations

import kiln_codegen_triton.kernel as tk
import kiln_loopir.scheduler as S
import pytest
import torch
from kiln_codegen_triton import compile_fx


def scale_of(x):
    amax = x.abs().amax()
    return 448.0 / amax.float().clamp(min=1e-12), amax


def float8_style_scaling(x):
    s = 448.0 / x.abs().amax().float().clamp(min=1e-12)
    return (x.float() * s).clamp(-448.0, 448.0), s.reciprocal()


@pytest.mark.parametrize("fn", [scale_of, float8_style_scaling])
def test_long_row_amax_with_epilogue_is_split(fn, monkeypatch):
    monkeypatch.setattr(tk, "SPLIT_MIN_RNUMEL", 1000)
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 64)
    monkeypatch.setattr(S, "ROW_STARVED_MIN_ROW", 1000)
    x = torch.randn(96, 40, dtype=torch.bfloat16)
    compiled = compile_fx(torch.fx.symbolic_trace(fn), [x])
    for a, e in zip(compiled(x), fn(x), strict=True):
        torch.testing.assert_close(a, e)
    split = [k.source for k in compiled.module.kernels if "kiln_kernel_final = " in k.source]
    assert len(split) == 1, [k.source[:200] for k in compiled.module.kernels]
