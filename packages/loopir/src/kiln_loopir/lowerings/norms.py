"""Vector norms: ``linalg_vector_norm`` (and ``dist``) as reductions.

``ord`` picks the reduction: inf -> max |x|, -inf -> min |x|, 0 -> count of non-zeros,
1 -> sum |x|, 2 -> sqrt(sum x*x), any other p -> (sum |x|^p)^(1/p). Half inputs compute in
float32 (as every reduction); ``dtype=`` computes in that dtype."""

from __future__ import annotations

import math

import torch

from ..ir.values import IRNode, Pointwise, compute_dtype
from ..lowering import LoweringError, lowering, make_pointwise, meta_val, realize, to_dtype
from ..virtualized import ops
from .reductions import _dims, make_reduction

aten = torch.ops.aten


def vector_norm(x: IRNode, ord=2, dim=None, keepdim=False, dtype=None) -> IRNode:
    """The norm of ``x`` over ``dim`` (an IRNode of the result dtype)."""
    src = x.get_dtype()
    out = dtype or (meta_val().dtype if isinstance(meta_val(), torch.Tensor) else src)
    if not out.is_floating_point or not src.is_floating_point:
        raise LoweringError("vector_norm of a non-float tensor")
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise LoweringError(f"vector_norm with ord={ord!r}")
    p = float(ord)
    cd = compute_dtype(out)
    dims = _dims(x, dim)

    def absval(v, idx):
        return ops.abs(to_dtype(v, src, cd))

    if p == math.inf or p == -math.inf:
        red = make_reduction(x, dims, keepdim, "max" if p > 0 else "min", cd, absval, src_dtype=cd)
        post = None
    elif p == 0:
        def nonzero(v, idx):
            return ops.to_dtype(ops.ne(absval(v, idx), ops.constant(0.0, cd)), cd)

        red = make_reduction(x, dims, keepdim, "sum", cd, nonzero, src_dtype=cd)
        post = None
    elif p == 1:
        red = make_reduction(x, dims, keepdim, "sum", cd, absval, src_dtype=cd)
        post = None
    elif p == 2:
        def square(v, idx):
            a = absval(v, idx)
            return ops.mul(a, a)

        red = make_reduction(x, dims, keepdim, "sum", cd, square, src_dtype=cd)
        post = ops.sqrt
    else:
        def powp(v, idx):
            return ops.pow(absval(v, idx), ops.constant(p, cd))

        red = make_reduction(x, dims, keepdim, "sum", cd, powp, src_dtype=cd)

        def post(v):
            return ops.pow(v, ops.constant(1.0 / p, cd))

    buf = realize(red)
    loader = buf.make_loader()

    def out_fn(index):
        v = loader(index)
        if post is not None:
            v = post(v)
        return to_dtype(v, cd, out)

    return Pointwise(x.get_device(), out, buf.get_size(), out_fn)


@lowering(aten.linalg_vector_norm.default)
def _linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return vector_norm(x, ord, dim, keepdim, dtype)


@lowering(aten.dist.default)
def _dist(a, b, p=2):
    diff = make_pointwise(ops.sub)(a, b)
    return vector_norm(diff, p, None, False, None)
