"""Outer reductions (``Tiling.outer``): a reduction whose loads are contiguous along the
outputs (``x.sum(0)`` of a row-major matrix: bias and LayerNorm weight gradients in every
training step) takes blocks of neighbouring outputs per program, so its loads coalesce; one
output per program would read a column. Checked against eager under the interpreter, with the
tiling asserted so a silent change of plan fails."""

from __future__ import annotations

import kiln_loopir
import kiln_runtime
import pytest
import torch
from kiln_codegen_triton import TritonCodegen
from kiln_codegen_triton.kernel import TritonKernel
from kiln_loopir.kernel_plan import is_outer_reduction, plan_kernel
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

CASES = {  # name -> (fn, expected tilings of its reduction kernels)
    "sum_dim0": (lambda x: x.sum(0), ["split"]),
    "amax_dim0": (lambda x: x.amax(0), ["split"]),
    "scaled_sum_plus_one": (lambda x: (x * 2).sum(0) + 1, ["split"]),  # +1: in the final kernel
    "var_dim0": (lambda x: x.var(0), ["outer"]),
    "bias_grad_of_3d": (lambda x: x.view(4, 128, 96).sum((0, 1)), ["split"]),
    "row_sum_stays_inner": (lambda x: x.sum(1), ["persistent"]),
}


def _tilings(sched) -> list[str]:
    out = []
    for group in sched.groups:
        plan = plan_kernel(group, sched)
        if plan.kind != "reduction":
            continue
        t = TritonKernel(plan, interpret=True).tiling
        out.append("split" if t.split else "outer" if t.outer else
                   "persistent" if t.persistent_rblock else "looped")
    return out


def _schedule(fn, x):
    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(x)
    return kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_outer_reduction_matches_eager(name):
    fn, want = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(512, 96)
    sched = _schedule(fn, x)
    assert _tilings(sched) == want
    call = kiln_runtime.load(kiln_loopir.generate_wrapper(sched, TritonCodegen()))
    (got,) = call(x)
    torch.testing.assert_close(got, fn(x), atol=1e-4, rtol=1e-4)


def _layernorm_grads(x):
    """A LayerNorm's weight and bias gradients: two reductions over the same columns (unsplit)."""
    return (x * 2).sum(0) + 1, x.var(0)


@pytest.mark.parametrize("outputs", [160, 8200])
def test_unsplit_outer_reduction_takes_16_outputs_per_program_when_few(outputs):
    from kiln_codegen_triton.codegen import candidate_configs

    sched = _schedule(_layernorm_grads, torch.randn(300, outputs))
    tilings = [TritonKernel(plan_kernel(g, sched), interpret=True).tiling for g in sched.groups]
    outer = [t for t in tilings if t.outer and not t.split]
    assert outer
    (config,) = candidate_configs(outer[0], outputs, 1, interpret=False)
    assert config["XBLOCK"] == (16 if outputs < 128 * 64 else 64)


def test_unsplit_outer_reduction_matches_eager():
    x = torch.randn(300, 160)
    sched = _schedule(_layernorm_grads, x)
    assert "outer" in _tilings(sched)
    call = kiln_runtime.load(kiln_loopir.generate_wrapper(sched, TritonCodegen()))
    for got, want in zip(call(x), _layernorm_grads(x), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_short_rows_stay_persistent():
    """A column of 17 rows fits one persistent block with many outputs per program."""
    x = torch.randn(17, 300)
    gm = make_fx(lambda x: x.sum(0))(x)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))
    (group,) = sched.groups
    assert is_outer_reduction(plan_kernel(group, sched))  # the loads are outer...
    assert _tilings(sched) == ["persistent"]  # ...but the row is short


def _weight_and_bias_grads(x, dy):
    """A LayerNorm's weight and bias gradients as the backward computes them: two sums over
    the same rows in one kernel, each result only stored."""
    return (dy * x).sum(0), dy.sum(0)


def test_two_reductions_over_the_same_rows_split_together():
    """Both sums split over chunks of rows in one kernel (a partial buffer each) and combine
    in one final kernel; unsplit, 768 outputs gave 12 programs of 64 outputs that each walked
    every row (47 us per LayerNorm on an H200 in BERT-base training)."""
    torch.manual_seed(0)
    x, dy = torch.randn(700, 96), torch.randn(700, 96)
    gm = make_fx(_weight_and_bias_grads)(x, dy)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x, dy]))
    (group,) = sched.groups
    kernel = TritonKernel(plan_kernel(group, sched), interpret=True)
    assert kernel.tiling.split and kernel.tiling.outer
    kernel.generate()
    assert kernel.partial_names == ["partial0", "partial1"]
    call = kiln_runtime.load(kiln_loopir.generate_wrapper(sched, TritonCodegen()))
    for got, want in zip(call(x, dy), _weight_and_bias_grads(x, dy), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
