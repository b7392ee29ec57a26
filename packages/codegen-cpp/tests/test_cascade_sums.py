"""Float sums add in a cascade (blocks of CASCADE_BLOCK elements, CASCADE_FANOUT blocks, then
the lanes), so their error stays within torch.sum's (issue 25: one chain per lane over 25,088
values was ~3x less accurate than torch, enough to flip batchnorm-then-ReLU masks in
training). Each case: the relative error against a float64 sum, full pipeline."""

import kiln_aotgrad
import kiln_loopir
import pytest
import torch
from kiln_codegen_cpp import CppCodegen, compile_fx
from kiln_codegen_cpp.compiler import vectorized_loops

CASES = {
    "all_1e6": (lambda x: x.sum(), (1_000_000,)),  # threads split the reduction
    "rows": (lambda x: x.sum(-1), (4, 250_000)),
    "batchnorm_dims": (lambda x: x.sum((0, 2, 3)), (2, 64, 112, 112)),  # rows of 112, outer dims
    "columns": (lambda x: x.sum(0), (25_088, 64)),  # lane mode
    "mean": (lambda x: x.mean(-1), (2, 16, 12_544)),
}


def _rel_error(got, ref):
    return ((got.double() - ref) / ref).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_sum_error_within_torch(name):
    fn, shape = CASES[name]
    torch.manual_seed(0)
    x = torch.rand(shape)
    gm = torch.fx.symbolic_trace(lambda t: fn(t))
    with torch.no_grad():
        got = compile_fx(gm, [x])(x)[0]
    ref = fn(x.double())
    kiln_err, torch_err = _rel_error(got, ref), _rel_error(fn(x), ref)
    # within 2 ulp, or twice torch's error: how a sum splits across threads moves the
    # result by an ulp either way (the lent H200 host's 16 threads: 1.0e-7 where torch
    # had 2.4e-8, both an ulp from the float64 sum); one chain per lane is 4-40 ulp off
    bound = max(2 * torch_err, 2 * torch.finfo(torch.float32).eps)
    assert kiln_err <= bound, (kiln_err, torch_err)


def test_cascade_keeps_the_sum_vectorized():
    x = torch.rand(4, 250_000)
    gm = torch.fx.symbolic_trace(lambda t: t.sum(-1))
    aten_gm = kiln_aotgrad.trace_inference(gm, [x])
    module = kiln_loopir.generate_wrapper(kiln_loopir.schedule(kiln_loopir.lower(aten_gm)), CppCodegen())
    (kernel,) = module.kernels
    assert "_blk" in kernel.source and "_mid" in kernel.source
    assert "for (int64_t l = 0; l < 16; l++)" in vectorized_loops(kernel.source)
