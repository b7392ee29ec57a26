"""Pointwise lowerings: unary/binary math, comparison, logical, bitwise, where, clamp, casts,
activations. Type promotion follows eager (torch._prims_common.elementwise_dtypes)."""

from __future__ import annotations

import functools
import math

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from ..ir.values import IRNode, Pointwise, compute_dtype
from ..lowering import (
    LoweringError,
    broadcast_loader,
    broadcast_shapes,
    constant_value,
    lowering,
    make_pointwise,
    meta_val,
    promote,
    to_dtype,
)
from ..virtualized import ops

aten = torch.ops.aten
prims = torch.ops.prims


def _c(v, like_dtype):
    return ops.constant(v, like_dtype)


def _register_unary(aten_ops, opname, kind):
    fn = make_pointwise(lambda x: getattr(ops, opname)(x), kind)
    lowering(*aten_ops)(fn)


# ---- unary float math (ints promote to float) -------------------------------------------------
for _name in ["sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
              "acosh", "atanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt",
              "rsqrt", "sigmoid", "erf", "erfc", "erfinv", "lgamma", "reciprocal"]:
    _pkt = getattr(aten, _name, None)
    if _pkt is not None:
        _register_unary([getattr(_pkt, "default", None)], _name, K.INT_TO_FLOAT)
    _pp = getattr(prims, _name, None)
    if _pp is not None:
        _register_unary([getattr(_pp, "default", None)], _name, K.INT_TO_FLOAT)

_register_unary([aten.abs.default], "abs", K.DEFAULT)
_register_unary([aten.neg.default], "neg", K.DEFAULT)


def _int_identity_or(opname):
    def lower_fn(x):
        if not x.get_dtype().is_floating_point:
            return make_pointwise(lambda v: v)(x)
        return make_pointwise(lambda v: getattr(ops, opname)(v))(x)

    return lower_fn


for _name in ["floor", "ceil", "round", "trunc"]:
    lowering(getattr(aten, _name).default)(_int_identity_or(_name))


@lowering(aten.round.decimals)
def _round_decimals(x, decimals=0):
    if decimals == 0:
        return _int_identity_or("round")(x)
    scale = 10.0 ** decimals

    def fn(v):
        c = ops.constant(scale, _dt(v, x))
        return ops.truediv(ops.round(ops.mul(v, c)), c)

    return make_pointwise(fn)(x)


def _dt(v, x):
    return compute_dtype(x.get_dtype())


@lowering(aten.sign.default, aten.sgn.default)
def _sign(x):
    if x.get_dtype() == torch.bool:
        return make_pointwise(lambda v: v)(x)
    return make_pointwise(ops.sign)(x)


@lowering(aten.signbit.default)
def _signbit(x):
    if x.get_dtype() == torch.bool or not x.get_dtype().is_signed:
        return make_pointwise(lambda v: ops.constant(False, torch.bool), K.ALWAYS_BOOL,
                              result_is_compute=True)(x)
    if not x.get_dtype().is_floating_point:
        return make_pointwise(lambda v: ops.lt(v, ops.constant(0, compute_dtype(x.get_dtype()))),
                              K.ALWAYS_BOOL, result_is_compute=True)(x)
    return make_pointwise(ops.signbit, K.ALWAYS_BOOL, result_is_compute=True)(x)


def _float_pred(opname, int_value):
    def lower_fn(x):
        if not x.get_dtype().is_floating_point:
            return make_pointwise(lambda v: ops.constant(int_value, torch.bool), K.ALWAYS_BOOL,
                                  result_is_compute=True)(x)
        return make_pointwise(getattr(ops, opname), K.ALWAYS_BOOL, result_is_compute=True)(x)

    return lower_fn


lowering(aten.isnan.default)(_float_pred("isnan", False))
lowering(aten.isinf.default)(_float_pred("isinf", False))
lowering(aten.isfinite.default)(_float_pred("isfinite", True))


@lowering(aten.isposinf.default)
def _isposinf(x):
    if not x.get_dtype().is_floating_point:
        return _float_pred("isinf", False)(x)
    cd = compute_dtype(x.get_dtype())
    return make_pointwise(lambda v: ops.eq(v, ops.constant(math.inf, cd)), K.ALWAYS_BOOL,
                          result_is_compute=True)(x)


@lowering(aten.isneginf.default)
def _isneginf(x):
    if not x.get_dtype().is_floating_point:
        return _float_pred("isinf", False)(x)
    cd = compute_dtype(x.get_dtype())
    return make_pointwise(lambda v: ops.eq(v, ops.constant(-math.inf, cd)), K.ALWAYS_BOOL,
                          result_is_compute=True)(x)


# ---- binary arithmetic ------------------------------------------------------------------------


def _add_like(opname):
    def lower_fn(a, b, alpha=None):
        comp, _ = promote([a, b])
        comp = compute_dtype(comp)
        if alpha is not None and alpha != 1:
            def fn(x, y):
                return getattr(ops, opname)(x, ops.mul(y, constant_value(alpha, comp)))
        else:
            fn = getattr(ops, opname)
        if isinstance(a, IRNode) or isinstance(b, IRNode):
            if comp == torch.bool and opname == "add":
                fn = ops.logical_or if alpha in (None, 1) else fn
            return make_pointwise(fn)(a, b)
        raise LoweringError("no tensor argument")

    return lower_fn


lowering(aten.add.Tensor, aten.add.Scalar, prims.add.default)(_add_like("add"))
lowering(aten.sub.Tensor, aten.sub.Scalar, prims.sub.default)(_add_like("sub"))


@lowering(aten.mul.Tensor, aten.mul.Scalar, prims.mul.default)
def _mul(a, b):
    comp, _ = promote([a, b])
    if compute_dtype(comp) == torch.bool:
        return make_pointwise(ops.logical_and)(a, b)
    return make_pointwise(ops.mul)(a, b)


@lowering(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def _div(a, b):
    return make_pointwise(ops.truediv, K.INT_TO_FLOAT)(a, b)


@lowering(prims.div.default)
def _prims_div(a, b):
    comp, _ = promote([a, b])
    if compute_dtype(comp).is_floating_point:
        return make_pointwise(ops.truediv)(a, b)
    return make_pointwise(ops.truncdiv)(a, b)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return _div(a, b)
    comp, _ = promote([a, b])
    comp = compute_dtype(comp)
    if rounding_mode == "trunc":
        if comp.is_floating_point:
            return make_pointwise(lambda x, y: ops.trunc(ops.truediv(x, y)))(a, b)
        return make_pointwise(ops.truncdiv)(a, b)
    if rounding_mode == "floor":
        return make_pointwise(ops.floordiv)(a, b)
    raise LoweringError(f"rounding_mode {rounding_mode}")


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(a, b):
    return make_pointwise(ops.floordiv)(a, b)


lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)(
    make_pointwise(ops.remainder))
lowering(aten.fmod.Tensor, aten.fmod.Scalar)(make_pointwise(ops.fmod))
lowering(aten.atan2.default)(make_pointwise(ops.atan2, K.INT_TO_FLOAT))
lowering(aten.hypot.default)(make_pointwise(ops.hypot))
lowering(aten.copysign.Tensor, aten.copysign.Scalar)(make_pointwise(ops.copysign, K.INT_TO_FLOAT))


def _minmax(opname):
    def lower_fn(a, b):
        comp, _ = promote([a, b])
        if compute_dtype(comp) == torch.bool:
            return make_pointwise(ops.logical_or if opname == "maximum" else ops.logical_and)(a, b)
        return make_pointwise(getattr(ops, opname))(a, b)

    return lower_fn


lowering(aten.maximum.default, prims.maximum.default)(_minmax("maximum"))
lowering(aten.minimum.default, prims.minimum.default)(_minmax("minimum"))


def _nan_ignoring(opname: str):
    """fmax/fmin: ``where(isnan(x), y, where(isnan(y), x, op(x, y)))``; integers have no NaN
    (plain maximum/minimum)."""
    def fn(x, y):
        return ops.where(ops.isnan(x), y, ops.where(ops.isnan(y), x, getattr(ops, opname)(x, y)))

    def lower_fn(a, b):
        comp, _ = promote([a, b])
        if not compute_dtype(comp).is_floating_point:
            return _minmax(opname)(a, b)
        return make_pointwise(fn)(a, b)

    return lower_fn


lowering(aten.fmax.default)(_nan_ignoring("maximum"))
lowering(aten.fmin.default)(_nan_ignoring("minimum"))


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(a, b):
    comp, res = promote([a, b], K.BOOL_TO_LONG)
    cd = compute_dtype(comp)
    if isinstance(a, IRNode) and not isinstance(b, IRNode) and not isinstance(b, sympy.Basic):
        # small exponents as products and reciprocals; the dtypes are those of a ** b (an
        # integer tensor to a float power is a float tensor: ``x ** 2.0``)
        unary = functools.partial(make_pointwise, override_compute_dtype=comp,
                                  override_result_dtype=res)
        e = b
        if e == 1:
            return unary(lambda x: x)(a)
        if e == 2:
            return unary(lambda x: ops.mul(x, x))(a)
        if e == 3:
            return unary(lambda x: ops.mul(ops.mul(x, x), x))(a)
        if cd.is_floating_point:
            if e == 0.5:
                return unary(ops.sqrt)(a)
            if e == -0.5:
                return unary(ops.rsqrt)(a)
            if e == -1:
                return unary(ops.reciprocal)(a)
            if e == -2:
                return unary(lambda x: ops.reciprocal(ops.mul(x, x)))(a)
    return make_pointwise(ops.pow, K.BOOL_TO_LONG)(a, b)


# ---- comparison / logical / bitwise ---------------------------------------------------------

for _name in ["eq", "ne", "lt", "le", "gt", "ge"]:
    _pkt = getattr(aten, _name)
    lowering(_pkt.Tensor, _pkt.Scalar, getattr(getattr(prims, _name, None), "default", None))(
        make_pointwise(getattr(ops, _name), K.ALWAYS_BOOL, result_is_compute=True))


def _to_bool_value(v, dt):
    return v if dt == torch.bool else ops.ne(v, ops.constant(False if dt == torch.bool else 0, dt))


def _logical(opname):
    def lower_fn(a, b):
        tensors = [x for x in (a, b) if isinstance(x, IRNode)]
        out_size = broadcast_shapes(*[t.get_size() for t in tensors])
        parts = []
        for x in (a, b):
            if isinstance(x, IRNode):
                parts.append((broadcast_loader(x, out_size), compute_dtype(x.get_dtype())))
            else:
                parts.append((bool(x), None))

        def inner_fn(index):
            vals = []
            for ld, dt in parts:
                if dt is None:
                    vals.append(ops.constant(ld, torch.bool))
                else:
                    vals.append(_to_bool_value(ld(index), dt))
            return getattr(ops, opname)(*vals)

        return Pointwise(tensors[0].get_device(), torch.bool, out_size, inner_fn)

    return lower_fn


lowering(aten.logical_and.default)(_logical("logical_and"))
lowering(aten.logical_or.default)(_logical("logical_or"))
lowering(aten.logical_xor.default)(_logical("logical_xor"))


@lowering(aten.logical_not.default)
def _logical_not(x):
    loader = x.make_loader()
    dt = compute_dtype(x.get_dtype())
    return Pointwise(x.get_device(), torch.bool, x.get_size(),
                     lambda idx: ops.logical_not(_to_bool_value(loader(idx), dt)))


def _bitwise(opname, bool_op):
    def lower_fn(a, b):
        comp, _ = promote([a, b])
        if comp.is_floating_point:
            raise LoweringError("bitwise op on floating point")
        if comp == torch.bool and bool_op is not None:
            return make_pointwise(getattr(ops, bool_op))(a, b)
        return make_pointwise(getattr(ops, opname))(a, b)

    return lower_fn


lowering(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise("bitwise_and", "logical_and"))
lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise("bitwise_or", "logical_or"))
lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise("bitwise_xor", "logical_xor"))
lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
         aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_bitwise("bitwise_left_shift", None))
lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
         aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_bitwise("bitwise_right_shift", None))


@lowering(aten.bitwise_not.default)
def _bitwise_not(x):
    if x.get_dtype() == torch.bool:
        return make_pointwise(ops.logical_not)(x)
    if x.get_dtype().is_floating_point:
        raise LoweringError("bitwise_not on floating point")
    return make_pointwise(ops.bitwise_not)(x)


# ---- where / clamp ------------------------------------------------------------------------------


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar,
          prims.where.default)
def _where(cond, a, b):
    meta = meta_val()
    res = meta.dtype if isinstance(meta, torch.Tensor) else promote([a, b])[1]
    cd = compute_dtype(res)
    tensors = [x for x in (cond, a, b) if isinstance(x, IRNode)]
    out_size = broadcast_shapes(*[t.get_size() for t in tensors])
    parts = []
    for x in (a, b):
        if isinstance(x, IRNode):
            parts.append((broadcast_loader(x, out_size), x.get_dtype()))
        else:
            parts.append((x, None))
    cl = broadcast_loader(cond, out_size) if isinstance(cond, IRNode) else None
    cdt = compute_dtype(cond.get_dtype()) if isinstance(cond, IRNode) else None

    def inner_fn(index):
        c = _to_bool_value(cl(index), cdt) if cl is not None else ops.constant(bool(cond), torch.bool)
        vals = []
        for ld, dt in parts:
            if dt is None:
                vals.append(constant_value(ld, cd))
            else:
                vals.append(to_dtype(ld(index), dt, res))
        return ops.where(c, vals[0], vals[1])

    return Pointwise(tensors[0].get_device(), res, out_size, inner_fn)


def _clamp_fn(lo_given, hi_given, comp):
    def fn(x, *bounds):
        k = 0
        if lo_given:
            x = ops.maximum(x, bounds[k])
            k += 1
        if hi_given:
            x = ops.minimum(x, bounds[k])
        return x

    return fn


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x, min=None, max=None):
    args = [x] + [b for b in (min, max) if b is not None]
    comp, res = promote(args)
    if compute_dtype(comp) == torch.bool:
        raise LoweringError("clamp on bool")
    return make_pointwise(_clamp_fn(min is not None, max is not None, comp))(*args)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x, min):
    return _clamp(x, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x, max):
    return _clamp(x, None, max)


# ---- casts, copies --------------------------------------------------------------------------


def _cast(x: IRNode, dtype: torch.dtype) -> Pointwise:
    loader = x.make_loader()
    src = x.get_dtype()

    def inner_fn(index):
        v = loader(index)
        if dtype == torch.bool and src != torch.bool:
            return ops.ne(v, ops.constant(0, compute_dtype(src)))
        return to_dtype(v, src, dtype)

    return Pointwise(x.get_device(), dtype, x.get_size(), inner_fn)


@lowering(aten._to_copy.default)
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device) != x.get_device():
        raise LoweringError("device change")
    if layout not in (None, torch.strided):
        raise LoweringError("layout change")
    return _cast(x, dtype or x.get_dtype())


@lowering(prims.convert_element_type.default)
def _convert_element_type(x, dtype):
    return _cast(x, dtype)


@lowering(aten.clone.default)
def _clone(x, memory_format=None):
    return _cast(x, x.get_dtype())


@lowering(aten.lift_fresh_copy.default)
def _lift_fresh_copy(x):
    return _cast(x, x.get_dtype())


@lowering(aten.alias.default, aten.lift_fresh.default, aten.detach.default)
def _alias(x):
    return x


@lowering(aten.copy.default)
def _copy(self, src, non_blocking=False):
    if self.get_device() != src.get_device():
        raise LoweringError("copy across devices")
    out_size = self.get_size()
    loader = broadcast_loader(src, out_size)
    s_dt, d_dt = src.get_dtype(), self.get_dtype()

    def inner_fn(index):
        v = loader(index)
        if d_dt == torch.bool and s_dt != torch.bool:
            return ops.ne(v, ops.constant(0, compute_dtype(s_dt)))
        return to_dtype(v, s_dt, d_dt)

    return Pointwise(self.get_device(), d_dt, out_size, inner_fn)


# ---- activations ------------------------------------------------------------------------------


def _float_only(x):
    if not x.get_dtype().is_floating_point:
        raise LoweringError("floating point only")


@lowering(aten.relu.default)
def _relu(x):
    if x.get_dtype() == torch.bool:
        raise LoweringError("relu on bool")
    return make_pointwise(ops.relu)(x)


@lowering(aten.gelu.default)
def _gelu(x, approximate="none"):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def c(v):
        return ops.constant(v, cd)

    if approximate == "tanh":
        def fn(v):
            inner = ops.mul(c(math.sqrt(2.0 / math.pi)), ops.add(v, ops.mul(c(0.044715), ops.mul(ops.mul(v, v), v))))
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), ops.tanh(inner)))
    else:
        def fn(v):
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), ops.erf(ops.mul(v, c(math.sqrt(0.5))))))

    return make_pointwise(fn)(x)


@lowering(aten.silu.default)
def _silu(x):
    _float_only(x)
    return make_pointwise(lambda v: ops.mul(v, ops.sigmoid(v)))(x)


@lowering(aten.mish.default)
def _mish(x):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def fn(v):
        sp = ops.where(ops.gt(v, ops.constant(20.0, cd)), v, ops.log1p(ops.exp(v)))
        return ops.mul(v, ops.tanh(sp))

    return make_pointwise(fn)(x)


@lowering(aten.hardtanh.default)
def _hardtanh(x, min_val=-1.0, max_val=1.0):
    return _clamp(x, min_val, max_val)


@lowering(aten.relu6.default)
def _relu6(x):
    return _clamp(x, 0, 6)


@lowering(aten.leaky_relu.default)
def _leaky_relu(x, negative_slope=0.01):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def fn(v):
        zero = ops.constant(0.0, cd)
        return ops.where(ops.gt(v, zero), v, ops.mul(v, ops.constant(float(negative_slope), cd)))

    return make_pointwise(fn)(x)


@lowering(aten.elu.default)
def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def fn(v):
        c = lambda k: ops.constant(float(k), cd)
        neg = ops.mul(ops.mul(c(alpha), ops.expm1(ops.mul(v, c(input_scale)))), c(scale))
        return ops.where(ops.gt(v, c(0.0)), ops.mul(v, c(scale)), neg)

    return make_pointwise(fn)(x)


@lowering(aten.celu.default)
def _celu(x, alpha=1.0):
    return _elu(x, alpha, 1.0, 1.0 / alpha)


@lowering(aten.selu.default)
def _selu(x):
    return _elu(x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0)


@lowering(aten.softplus.default)
def _softplus(x, beta=1.0, threshold=20.0):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def fn(v):
        c = lambda k: ops.constant(float(k), cd)
        bx = ops.mul(v, c(beta))
        return ops.where(ops.gt(bx, c(threshold)), v, ops.truediv(ops.log1p(ops.exp(bx)), c(beta)))

    return make_pointwise(fn)(x)


def _hard_activation(formula):
    """A float-only activation ``formula(v, c)`` (``c(k)``: the constant k in the compute
    dtype) over ``relu6(v + 3)``, the ramp hardsigmoid and hardswish share."""
    def lower_fn(x):
        _float_only(x)
        cd = compute_dtype(x.get_dtype())

        def fn(v):
            c = lambda k: ops.constant(float(k), cd)
            return formula(v, c, ops.minimum(ops.maximum(ops.add(v, c(3)), c(0)), c(6)))

        return make_pointwise(fn)(x)

    return lower_fn


lowering(aten.hardsigmoid.default)(
    _hard_activation(lambda v, c, ramp: ops.truediv(ramp, c(6))))
lowering(aten.hardswish.default)(
    _hard_activation(lambda v, c, ramp: ops.truediv(ops.mul(v, ramp), c(6))))


@lowering(aten.logit.default)
def _logit(x, eps=None):
    _float_only(x)
    cd = compute_dtype(x.get_dtype())

    def fn(v):
        if eps is not None:
            v = ops.minimum(ops.maximum(v, ops.constant(float(eps), cd)), ops.constant(1.0 - float(eps), cd))
        return ops.log(ops.truediv(v, ops.sub(ops.constant(1.0, cd), v)))

    return make_pointwise(fn)(x)


@lowering(aten.nan_to_num.default)
def _nan_to_num(x, nan=None, posinf=None, neginf=None):
    dt = x.get_dtype()
    if not dt.is_floating_point:
        return _cast(x, dt)
    info = torch.finfo(dt)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    cd = compute_dtype(dt)

    def fn(v):
        c = lambda k: ops.constant(float(k), cd)
        v = ops.where(ops.isnan(v), c(nan), v)
        v = ops.where(ops.eq(v, c(math.inf)), c(posinf), v)
        return ops.where(ops.eq(v, c(-math.inf)), c(neginf), v)

    return make_pointwise(fn)(x)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(a, b, w):
    return make_pointwise(lambda x, y, t: ops.add(x, ops.mul(t, ops.sub(y, x))))(a, b, w)


@lowering(aten.addcmul.default)
def _addcmul(s, t1, t2, value=1):
    comp, _ = promote([s, t1, t2])
    cd = compute_dtype(comp)
    return make_pointwise(lambda a, b, c: ops.add(a, ops.mul(ops.mul(b, c), constant_value(value, cd))))(s, t1, t2)


@lowering(aten.addcdiv.default)
def _addcdiv(s, t1, t2, value=1):
    comp, _ = promote([s, t1, t2])
    cd = compute_dtype(comp)
    return make_pointwise(lambda a, b, c: ops.add(a, ops.mul(ops.truediv(b, c), constant_value(value, cd))))(s, t1, t2)


@lowering(aten.square.default)
def _square(x):
    return make_pointwise(lambda v: ops.mul(v, v), K.BOOL_TO_LONG)(x)


@lowering(aten.frac.default)
def _frac(x):
    _float_only(x)
    return make_pointwise(lambda v: ops.sub(v, ops.trunc(v)))(x)


@lowering(aten.xlogy.Tensor)
def _xlogy(a, b):
    def fn(x, y):
        zero = ops.mul(x, ops.constant(0.0, _first_float(a, b)))
        return ops.where(ops.isnan(y), y, ops.where(ops.eq(x, zero), zero, ops.mul(x, ops.log(y))))

    return make_pointwise(fn, K.INT_TO_FLOAT)(a, b)


def _first_float(a, b):
    comp, _ = promote([a, b], K.INT_TO_FLOAT)
    return compute_dtype(comp)
