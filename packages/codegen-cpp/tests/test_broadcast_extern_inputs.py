"""A broadcast (``expand``) of a computed value that an extern call reads stays a stride-0 view
of the value's own buffer, as eager passes it (an attention mask expanded over the heads),
instead of a copy as large as the broadcast. Checked against eager through the C++ codegen,
with the wrapper's buffers asserted so that a silent copy fails."""

from __future__ import annotations

import kiln_loopir
import kiln_runtime
import torch
from kiln_aotgrad import core_decompositions
from kiln_codegen_cpp import CppCodegen
from torch.fx.experimental.proxy_tensor import make_fx


def _mm_of_broadcast_row(x, w):
    return torch.mm((x * 2).expand(5, 8), w)


def _attention_with_expanded_mask(q, k, v, m):
    bias = torch.zeros((), dtype=q.dtype).masked_fill(m.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=bias.expand(2, 4, 16, 16))[0]


def _compile(fn, args):
    gm = make_fx(fn, decomposition_table=core_decompositions())(*args)
    module = kiln_loopir.generate_wrapper(kiln_loopir.schedule(kiln_loopir.lower(gm, args)), CppCodegen())
    return module.wrapper_source, kiln_runtime.load(module)


def test_mm_reads_the_broadcast_row_with_stride_zero():
    x, w = torch.randn(1, 8), torch.randn(8, 3)
    source, call = _compile(_mm_of_broadcast_row, [x, w])
    assert "empty_strided_cpu((1, 8)" in source and "(5, 8), (0, 1)" in source, source
    (got,) = call(x, w)
    torch.testing.assert_close(got, _mm_of_broadcast_row(x, w))


def test_attention_reads_the_mask_broadcast_over_heads():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    m = torch.rand(2, 1, 16, 16) > 0.3
    m[..., 0] = True
    source, call = _compile(_attention_with_expanded_mask, [q, k, v, m])
    assert "empty_strided_cpu((2, 1, 16, 16)" in source and "(256, 0, 16, 1)" in source, source
    (got,) = call(q, k, v, m)
    torch.testing.assert_close(got, _attention_with_expanded_mask(q, k, v, m))
