"""Ops that are extern calls by design (library kernels): matmul family, convolution,
attention. They are ``ExternKernel``s with ``fallback=False`` (not counted as fallbacks)."""

from __future__ import annotations

import torch

from ..lowering import lowering, make_extern, meta_val

aten = torch.ops.aten

EXTERN_OPS = []
for _name in ["mm.default", "bmm.default", "addmm.default", "baddbmm.default", "addbmm.default",
              "convolution.default", "_convolution.default", "matmul.default",
              "_scaled_dot_product_flash_attention_for_cpu.default",
              "_scaled_dot_product_flash_attention.default",
              "_scaled_dot_product_efficient_attention.default",
              "_scaled_dot_product_cudnn_attention.default",
              "scaled_dot_product_attention.default",
              "_weight_int8pack_mm.default", "dot.default", "mv.default", "addmv.default"]:
    _pkt, _, _ov = _name.partition(".")
    _p = getattr(aten, _pkt, None)
    if _p is not None and hasattr(_p, _ov):
        EXTERN_OPS.append(getattr(_p, _ov))


def _make(op):
    def lower_fn(*args, **kwargs):
        return make_extern(op, args, kwargs, meta_val(), fallback=False)

    return lower_fn


for _op in EXTERN_OPS:
    lowering(_op)(_make(_op))
