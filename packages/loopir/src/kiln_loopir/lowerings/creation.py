"""Creation lowerings: full/zeros/ones/empty/scalar_tensor/arange (+ *_like)."""

from __future__ import annotations

import torch

from ..ir.values import Pointwise, compute_dtype
from ..lowering import (
    LoweringError,
    aten_ops,
    constant_value,
    current,
    lowering,
    meta_val,
    to_dtype,
)
from ..sizevars import sympify
from ..virtualized import ops

aten = torch.ops.aten


def _meta_tensor():
    m = meta_val()
    if not isinstance(m, torch.Tensor):
        raise LoweringError("creation op without a tensor meta value")
    g = current()
    return m, [g.expr(s) for s in m.shape]


def _filled(value):
    m, size = _meta_tensor()
    dtype = m.dtype
    if dtype.is_complex:
        raise LoweringError("complex")
    cd = compute_dtype(dtype)

    def inner_fn(index):
        v = constant_value(value, dtype)
        return v if cd == compute_dtype(dtype) else to_dtype(v, cd, dtype)

    return Pointwise(m.device, dtype, size, inner_fn)


@lowering(*aten_ops("full.default", "new_full.default"))
def _full(*args, **kwargs):
    # full(size, fill_value, ...) / new_full(self, size, fill_value, ...)
    fill = kwargs.get("fill_value")
    if fill is None:
        fill = args[1] if not hasattr(args[0], "get_size") else args[2]
    return _filled(fill)


@lowering(*aten_ops("full_like.default"))
def _full_like(x, fill_value, **kwargs):
    return _filled(fill_value)


@lowering(*aten_ops("scalar_tensor.default"))
def _scalar_tensor(s, **kwargs):
    return _filled(s)


@lowering(*aten_ops("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
                "empty_like.default", "new_empty.default", "empty_strided.default",
                "new_empty_strided.default", "empty_permuted.default"))
def _zeros(*args, **kwargs):
    return _filled(0)


@lowering(*aten_ops("ones.default", "ones_like.default", "new_ones.default"))
def _ones(*args, **kwargs):
    return _filled(1)


def _as_integer(x):
    """A Python/SymPy number truncated toward zero as eager's scalar conversion does (SymPy
    size expressions are integers already)."""
    x = sympify(x)
    if x.is_Integer or not x.is_number:
        return x
    return sympify(int(float(x)))


@lowering(*aten_ops("arange.start_step", "arange.start", "arange.default"))
def _arange(*args, **kwargs):
    m, size = _meta_tensor()
    if len(size) != 1:
        raise LoweringError("arange of rank != 1")
    nums = [a for a in args if not isinstance(a, (torch.dtype, torch.device, torch.layout))]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    start = kwargs.get("start", start)
    step = kwargs.get("step", step)
    dtype = m.dtype
    cd = compute_dtype(dtype)

    def inner_fn(index):
        i = index[0]
        if not cd.is_floating_point:
            # integer arange: eager converts start and step to the integer type first
            # (``arange(0, 64, 2.0, dtype=torch.int64)`` steps by 2), so the index stays integral
            expr = _as_integer(start) + i * _as_integer(step)
            return ops.index_expr(expr, cd) if cd == torch.int64 else \
                ops.to_dtype(ops.index_expr(expr, torch.int64), cd)
        # floating: start + i*step computed in float64 like eager's accumulate type on CPU
        acc = torch.float64
        v = ops.add(ops.mul(ops.to_dtype(ops.index_expr(i, torch.int64), acc), constant_value(step, acc)),
                    constant_value(start, acc))
        return ops.to_dtype(v, cd) if dtype not in (torch.float16, torch.bfloat16) else \
            ops.to_dtype(ops.to_dtype(v, dtype), torch.float32)

    return Pointwise(m.device, dtype, size, inner_fn)
