"""Small pointwise specials without an op of their own in the op set: ldexp, angle (real),
narrow_copy, and digamma/polygamma built from existing ops (log, reciprocal, where...)."""

from __future__ import annotations

import math

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from ..ir.values import compute_dtype
from ..lowering import LoweringError, lowering, make_pointwise, promote
from ..virtualized import ops
from .views import slice_

aten = torch.ops.aten


def _float_compute(*args) -> torch.dtype:
    """The compute dtype of an INT_TO_FLOAT op on ``args`` (what make_pointwise's fn sees)."""
    return compute_dtype(promote(args, K.INT_TO_FLOAT)[0])


@lowering(aten.ldexp.Tensor)
def _ldexp(x, other):
    """x * 2**other (eager's definition: mul(x, pow(2.0, other)))."""
    cd = _float_compute(x, other)

    def fn(a, b):
        return ops.mul(a, ops.pow(ops.constant(2.0, cd), b))

    return make_pointwise(fn, K.INT_TO_FLOAT)(x, other)


@lowering(aten.angle.default)
def _angle(x):
    """Real angle: pi for negatives, 0 otherwise, NaN stays NaN."""
    if x.get_dtype().is_complex:
        raise LoweringError("complex angle")
    cd = _float_compute(x)

    def fn(v):
        r = ops.where(ops.lt(v, ops.constant(0.0, cd)), ops.constant(math.pi, cd), ops.constant(0.0, cd))
        return ops.where(ops.isnan(v), v, r)

    return make_pointwise(fn, K.INT_TO_FLOAT)(x)


@lowering(aten.narrow_copy.default)
def _narrow_copy(x, dim, start, length):
    return slice_(x, dim, start, start + length)


# ---- digamma / trigamma (polygamma n = 0, 1): ATen's Cephes-derived algorithms, with their
# data-dependent loops unrolled under ``where`` (at most 10 and 6 steps) -----------------------

_PSI_10 = 2.25175258906672110764
_DIGAMMA_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
              -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
              8.33333333333333333333E-2)


def digamma_value(x, cd: torch.dtype):
    """digamma of an ops value of float dtype ``cd`` (as ATen's calc_digamma)."""
    def c(v):
        return ops.constant(v, cd)

    f64 = torch.float64
    neg = ops.lt(x, c(0.0))
    xd = ops.to_dtype(x, f64) if cd != f64 else x
    frac = ops.sub(xd, ops.trunc(xd))  # modf's fractional part, computed in double as ATen
    refl = ops.truediv(ops.constant(math.pi, f64), ops.tan(ops.mul(ops.constant(math.pi, f64), frac)))
    refl = ops.to_dtype(refl, cd) if cd != f64 else refl
    y = ops.where(neg, ops.sub(c(1.0), x), x)
    result = c(0.0)
    for _ in range(10):  # push y to >= 10 (y > 0 here, so at most 10 steps)
        active = ops.lt(y, c(10.0))
        result = ops.where(active, ops.sub(result, ops.truediv(c(1.0), y)), result)
        y = ops.where(active, ops.add(y, c(1.0)), y)
    z = ops.truediv(c(1.0), ops.mul(y, y))
    poly = c(_DIGAMMA_A[0])
    for a in _DIGAMMA_A[1:]:
        poly = ops.add(ops.mul(poly, z), c(a))
    asym = ops.sub(ops.sub(ops.add(result, ops.log(y)), ops.truediv(c(0.5), y)), ops.mul(z, poly))
    val = ops.where(ops.eq(y, c(10.0)), ops.add(result, c(_PSI_10)), asym)
    val = ops.where(neg, ops.sub(val, refl), val)
    val = ops.where(ops.logical_and(neg, ops.eq(x, ops.trunc(x))), c(math.nan), val)
    return ops.where(ops.eq(x, c(0.0)), ops.copysign(c(math.inf), ops.neg(x)), val)


def trigamma_value(x, cd: torch.dtype):
    """trigamma of an ops value of float dtype ``cd`` (as ATen's trigamma)."""
    def c(v):
        return ops.constant(v, cd)

    small = ops.lt(x, c(0.5))
    pi = c(math.pi)
    s = ops.sin(ops.mul(pi, x))
    result = ops.where(small, ops.sub(c(0.0), ops.truediv(ops.mul(pi, pi), ops.mul(s, s))), c(0.0))
    y = ops.where(small, ops.sub(c(1.0), x), x)
    for _ in range(6):
        result = ops.add(result, ops.truediv(c(1.0), ops.mul(y, y)))
        y = ops.add(y, c(1.0))
    ixx = ops.truediv(c(1.0), ops.mul(y, y))
    inner = ops.mul(ixx, ops.sub(c(1.0 / 30), ops.mul(ixx, c(1.0 / 42))))
    series = ops.add(ops.add(c(1.0), ops.truediv(c(1.0), ops.mul(c(2.0), y))),
                     ops.mul(ixx, ops.sub(c(1.0 / 6), inner)))
    result = ops.add(result, ops.truediv(series, y))
    return ops.mul(ops.where(small, c(-1.0), c(1.0)), result)


@lowering(aten.digamma.default)
def _digamma(x):
    cd = _float_compute(x)
    return make_pointwise(lambda v: digamma_value(v, cd), K.INT_TO_FLOAT)(x)


@lowering(aten.polygamma.default)
def _polygamma(n, x):
    if n == 0:
        return _digamma(x)
    if n == 1:
        cd = _float_compute(x)
        return make_pointwise(lambda v: trigamma_value(v, cd), K.INT_TO_FLOAT)(x)
    raise LoweringError(f"polygamma of order {n} (needs the Hurwitz zeta function)")
