"""Reduction lowerings: sum/mean/prod/amax/amin/argmax/argmin/any/all/var/std/logsumexp,
softmax/log_softmax and native_layer_norm (when they reach loopir undecomposed).

Every reduction is realized into its own ComputedBuffer (its pointwise prologue is inlined into
the reduction body); epilogues are Pointwise values over it, which the scheduler fuses into the
reduction's group. var/std/var_mean and layer_norm's statistics are one Welford pass
(``welford_m2`` + ``welford_mean`` reductions over the same value).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy
import torch

from ..ir.values import IRNode, Pointwise, Reduction, compute_dtype
from ..lowering import (
    LoweringError,
    broadcast_loader,
    constant_value,
    lowering,
    meta_val,
    realize,
    to_dtype,
)
from ..virtualized import ops

aten = torch.ops.aten
S0 = sympy.Integer(0)


def _dims(x: IRNode, dim) -> list[int]:
    n = len(x.get_size())
    if dim is None:
        return list(range(n))
    if isinstance(dim, int):
        dim = [dim]
    dims = list(dim)
    if not dims:
        return list(range(n))
    if n == 0:
        return []
    return sorted({d % n for d in dims})


def make_reduction(x: IRNode, dims: list[int], keepdim: bool, rtype: str, out_dtype: torch.dtype,
                   value_fn: Callable | None = None, src_dtype: torch.dtype | None = None,
                   acc_dtype: torch.dtype | None = None) -> Reduction:
    """Reduce ``x`` over ``dims``. ``value_fn(v, full_index)`` maps the loaded value (compute
    dtype of x) to the reduced value (dtype ``src_dtype``, default compute(x.dtype))."""
    size = list(x.get_size())
    loader = x.make_loader()
    n = len(size)
    kept = [k for k in range(n) if k not in dims]
    if keepdim:
        ranges = [sympy.Integer(1) if k in dims else size[k] for k in range(n)]
    else:
        ranges = [size[k] for k in kept]
    rranges = [size[k] for k in dims]
    src_dtype = src_dtype or compute_dtype(x.get_dtype())

    def inner_fn(index, rindex):
        full = [S0] * n
        if keepdim:
            for k in kept:
                full[k] = index[k]
        else:
            for j, k in enumerate(kept):
                full[k] = index[j]
        for j, k in enumerate(dims):
            full[k] = rindex[j]
        v = loader(full)
        if value_fn is not None:
            v = value_fn(v, full)
        return v

    return Reduction(x.get_device(), out_dtype, src_dtype, ranges, rranges, rtype, inner_fn,
                     acc_dtype=acc_dtype)


def _out_dtype(default):
    m = meta_val()
    if isinstance(m, torch.Tensor):
        return m.dtype
    if isinstance(m, (tuple, list)) and m and isinstance(m[0], torch.Tensor):
        return m[0].dtype
    return default


def _sum_like(rtype):
    def lower_fn(x, dim=None, keepdim=False, *, dtype=None):
        dims = _dims(x, dim)
        out = dtype or _out_dtype(x.get_dtype())
        if out == torch.bool and rtype == "sum":
            return _any_all("any")(x, dims, keepdim)
        if out == torch.bool and rtype == "prod":
            return _any_all("all")(x, dims, keepdim)
        src = x.get_dtype()
        cout = compute_dtype(out)
        fn = (lambda v, idx: to_dtype(v, src, out)) if compute_dtype(src) != cout else None
        return make_reduction(x, dims, keepdim, rtype, out, fn, src_dtype=cout)

    return lower_fn


@lowering(aten.sum.dim_IntList)
def _sum(x, dim=None, keepdim=False, *, dtype=None):
    return _sum_like("sum")(x, dim, keepdim, dtype=dtype)


@lowering(aten.sum.default)
def _sum_all(x, *, dtype=None):
    return _sum_like("sum")(x, None, False, dtype=dtype)


@lowering(aten.prod.dim_int)
def _prod(x, dim, keepdim=False, *, dtype=None):
    return _sum_like("prod")(x, dim, keepdim, dtype=dtype)


@lowering(aten.prod.default)
def _prod_all(x, *, dtype=None):
    return _sum_like("prod")(x, None, False, dtype=dtype)


def _numel(x, dims):
    n = sympy.Integer(1)
    for d in dims:
        n = n * x.get_size()[d]
    return n


@lowering(aten.mean.dim, aten.mean.default)
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(x, dim)
    out = dtype or _out_dtype(x.get_dtype())
    if not out.is_floating_point:
        raise LoweringError("mean of integers")
    cd = compute_dtype(out)
    src = x.get_dtype()
    fn = (lambda v, idx: to_dtype(v, src, cd)) if compute_dtype(src) != cd else None
    red = realize(make_reduction(x, dims, keepdim, "sum", cd, fn, src_dtype=cd))
    nel = _numel(x, dims)
    loader = red.make_loader()

    def inner_fn(index):
        return to_dtype(ops.truediv(loader(index), constant_value(nel, cd)), cd, out)

    return Pointwise(x.get_device(), out, red.get_size(), inner_fn)


def _minmax_red(rtype):
    def lower_fn(x, dim=None, keepdim=False):
        dims = _dims(x, dim)
        dt = x.get_dtype()
        if dt == torch.bool:
            return _any_all("any" if rtype == "max" else "all")(x, dims, keepdim)
        return make_reduction(x, dims, keepdim, rtype, dt)

    return lower_fn


lowering(aten.amax.default)(_minmax_red("max"))
lowering(aten.amin.default)(_minmax_red("min"))


@lowering(aten.max.default)
def _max_all(x):
    return _minmax_red("max")(x, None, False)


@lowering(aten.min.default)
def _min_all(x):
    return _minmax_red("min")(x, None, False)


def _arg_red(rtype):
    def lower_fn(x, dim=None, keepdim=False):
        if dim is None:
            if keepdim:
                raise LoweringError("argmax(dim=None, keepdim=True)")
            dims = list(range(len(x.get_size())))
        else:
            dims = _dims(x, dim)
        fn = None
        if x.get_dtype() == torch.bool:
            fn = lambda v, idx: ops.to_dtype(v, torch.int64)
            red = make_reduction(x, dims, keepdim, rtype, torch.int64, fn, src_dtype=torch.int64)
        else:
            red = make_reduction(x, dims, keepdim, rtype, torch.int64)
        if all(x.get_size()[d] == 1 for d in dims):  # one element per output (0-dim input too)
            return Pointwise(x.get_device(), torch.int64, red.get_size(),
                             lambda index: ops.constant(0, torch.int64))
        return red

    return lower_fn


lowering(aten.argmax.default)(_arg_red("argmax"))
lowering(aten.argmin.default)(_arg_red("argmin"))


def _val_idx(rtype, artype):
    def lower_fn(x, dim, keepdim=False):
        vals = _minmax_red(rtype)(x, dim, keepdim)
        idx = _arg_red(artype)(x, dim, keepdim)
        return (realize(vals), realize(idx))

    return lower_fn


lowering(aten.max.dim)(_val_idx("max", "argmax"))
lowering(aten.min.dim)(_val_idx("min", "argmin"))


def _any_all(rtype):
    def lower_fn(x, dim=None, keepdim=False):
        dims = _dims(x, dim)
        src = compute_dtype(x.get_dtype())

        def fn(v, idx):
            return v if src == torch.bool else ops.ne(v, ops.constant(0, src))

        out = _out_dtype(torch.bool)
        if out != torch.bool:  # any/all on uint8 return uint8
            raise LoweringError("any/all with a non-bool result")
        return make_reduction(x, dims, keepdim, rtype, torch.bool, fn, src_dtype=torch.bool)

    return lower_fn


lowering(aten.any.default, aten.any.dim, aten.any.dims)(_any_all("any"))
lowering(aten.all.default, aten.all.dim, aten.all.dims)(_any_all("all"))


# ---- var / std --------------------------------------------------------------------------------


def _var_mean_impl(x, dims, correction, keepdim, out_dtype):
    """(var, mean) in out_dtype from one Welford pass: ``welford_m2`` and ``welford_mean``
    reductions over the same value, which a codegen computes in one loop over the row. The
    mean is returned unrealized (realize it to use it), so var/std alone compute no mean
    buffer."""
    cd = compute_dtype(out_dtype)
    src = x.get_dtype()
    conv = (lambda v, idx: to_dtype(v, src, cd)) if compute_dtype(src) != cd else None
    m2 = realize(make_reduction(x, dims, keepdim, "welford_m2", cd, conv, src_dtype=cd))
    mean = make_reduction(x, dims, keepdim, "welford_mean", cd, conv, src_dtype=cd)
    m2_loader = m2.make_loader()
    denom = sympy.simplify(_numel(x, dims) - (1 if correction is None else correction))
    if denom.is_Integer:
        denom = max(int(denom), 0)

    def var_fn(index):
        dn = constant_value(denom, cd)
        if not isinstance(denom, int):
            dn = ops.maximum(dn, ops.constant(0.0, cd))
        return ops.truediv(m2_loader(index), dn)

    return Pointwise(x.get_device(), cd, m2.get_size(), var_fn), mean


def _cast_node(x: IRNode, dtype) -> IRNode:
    if x.get_dtype() == dtype:
        return x
    loader = x.make_loader()
    src = x.get_dtype()
    return Pointwise(x.get_device(), dtype, x.get_size(), lambda idx: to_dtype(loader(idx), src, dtype))


def _sqrt_node(x: IRNode) -> IRNode:
    loader = x.make_loader()
    return Pointwise(x.get_device(), x.get_dtype(), x.get_size(), lambda idx: ops.sqrt(loader(idx)))


def _var_args(x, dim, correction, keepdim, unbiased=None):
    if not x.get_dtype().is_floating_point:
        raise LoweringError("var of integers")
    if correction is None:
        correction = 1 if unbiased is None else (1 if unbiased else 0)
    return _dims(x, dim), correction, keepdim


def _moments(std: bool, with_mean: bool):
    """The ``.correction`` lowering of var / std / var_mean / std_mean: one Welford
    reduction; ``std`` takes the square root, ``with_mean`` returns the mean too."""
    def lower_fn(x, dim=None, *, correction=None, keepdim=False):
        dims, c, keepdim = _var_args(x, dim, correction, keepdim)
        v, m = _var_mean_impl(x, dims, c, keepdim, x.get_dtype())
        out = _cast_node(_sqrt_node(v) if std else v, x.get_dtype())
        return (out, _cast_node(realize(m), x.get_dtype())) if with_mean else out

    return lower_fn


def _unbiased(correction_lowering):
    """The ``.dim`` overload (``unbiased``: Bessel's correction or none)."""
    def lower_fn(x, dim=None, unbiased=True, keepdim=False):
        return correction_lowering(x, dim, correction=1 if unbiased else 0, keepdim=keepdim)

    return lower_fn


_var = lowering(aten.var.correction)(_moments(std=False, with_mean=False))
_std = lowering(aten.std.correction)(_moments(std=True, with_mean=False))
lowering(aten.var.dim)(_unbiased(_var))
lowering(aten.std.dim)(_unbiased(_std))
lowering(aten.var_mean.correction)(_moments(std=False, with_mean=True))
lowering(aten.std_mean.correction)(_moments(std=True, with_mean=True))


# ---- logsumexp / softmax -------------------------------------------------------------------------


def _safe_max(x, dims, keepdim=True):
    """amax over dims (keepdim) with +-inf replaced by 0 (as torch's logsumexp/softmax)."""
    return realize(make_reduction(x, dims, keepdim, "max", compute_dtype(x.get_dtype()),
                                  src_dtype=compute_dtype(x.get_dtype())))


@lowering(aten.logsumexp.default)
def _logsumexp(x, dim, keepdim=False):
    if not x.get_dtype().is_floating_point:
        raise LoweringError("logsumexp of integers")
    dims = _dims(x, dim)
    cd = compute_dtype(x.get_dtype())
    mx = _safe_max(x, dims)
    mx_loader = mx.make_loader()
    n = len(x.get_size())

    def m_at(full):
        m = mx_loader([S0 if k in dims else full[k] for k in range(n)])
        return ops.where(ops.eq(ops.abs(m), ops.constant(math.inf, cd)), ops.constant(0.0, cd), m)

    def fn(v, full):
        return ops.exp(ops.sub(v, m_at(full)))

    s = realize(make_reduction(x, dims, keepdim, "sum", cd, fn, src_dtype=cd))
    s_loader = s.make_loader()
    kept = [k for k in range(n) if k not in dims]

    def out_fn(index):
        if keepdim:
            full = list(index)
        else:
            full = [S0] * n
            for j, k in enumerate(kept):
                full[k] = index[j]
        return to_dtype(ops.add(ops.log(s_loader(index)), m_at(full)), cd, x.get_dtype())

    return Pointwise(x.get_device(), x.get_dtype(), s.get_size(), out_fn)


def _softmax_impl(x, dim, half_to_float, log):
    if not x.get_dtype().is_floating_point:
        raise LoweringError("softmax of integers")
    dims = _dims(x, dim)
    out = _out_dtype(torch.float32 if half_to_float else x.get_dtype())
    cd = compute_dtype(x.get_dtype())
    mx = realize(make_reduction(x, dims, True, "max", cd, src_dtype=cd))
    mx_loader = mx.make_loader()
    n = len(x.get_size())
    x_loader = x.make_loader()

    def m_at(full):
        return mx_loader([S0 if k in dims else full[k] for k in range(n)])

    def fn(v, full):
        return ops.exp(ops.sub(v, m_at(full)))

    s = realize(make_reduction(x, dims, True, "sum", cd, fn, src_dtype=cd))
    s_loader = s.make_loader()

    def out_fn(index):
        kidx = [S0 if k in dims else index[k] for k in range(n)]
        d = ops.sub(x_loader(index), mx_loader(kidx))
        if log:
            r = ops.sub(d, ops.log(s_loader(kidx)))
        else:
            r = ops.truediv(ops.exp(d), s_loader(kidx))
        return to_dtype(r, cd, out)

    return Pointwise(x.get_device(), out, x.get_size(), out_fn)


@lowering(aten._softmax.default)
def _softmax(x, dim, half_to_float=False):
    return _softmax_impl(x, dim, half_to_float, log=False)


@lowering(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float=False):
    return _softmax_impl(x, dim, half_to_float, log=True)


@lowering(aten.native_layer_norm.default)
def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    if not x.get_dtype().is_floating_point:
        raise LoweringError("layer_norm of integers")
    n = len(x.get_size())
    k = len(normalized_shape)
    dims = list(range(n - k, n))
    dt = x.get_dtype()
    cd = compute_dtype(dt)
    var_b, mean_b = _var_mean_impl(x, dims, 0, True, cd)
    mean_b = realize(mean_b)
    v_loader, m_loader = var_b.make_loader(), mean_b.make_loader()
    x_loader = x.make_loader()
    w_loader = broadcast_loader(weight, x.get_size()) if weight is not None else None
    b_loader = broadcast_loader(bias, x.get_size()) if bias is not None else None

    def rstd_at(kidx):
        return ops.rsqrt(ops.add(v_loader(kidx), ops.constant(float(eps), cd)))

    def out_fn(index):
        kidx = [S0 if j in dims else index[j] for j in range(n)]
        v = to_dtype(x_loader(index), dt, cd) if compute_dtype(dt) != cd else x_loader(index)
        r = ops.mul(ops.sub(v, m_loader(kidx)), rstd_at(kidx))
        if w_loader is not None:
            r = ops.mul(r, to_dtype(w_loader(index), weight.get_dtype(), cd))
        if b_loader is not None:
            r = ops.add(r, to_dtype(b_loader(index), bias.get_dtype(), cd))
        return to_dtype(r, cd, dt)

    out = Pointwise(x.get_device(), dt, x.get_size(), out_fn)
    m = meta_val()
    stat_dtype = m[1].dtype if isinstance(m, (tuple, list)) else cd
    mean_out = _cast_node(mean_b, stat_dtype)
    rstd = Pointwise(x.get_device(), stat_dtype, var_b.get_size(),
                     lambda idx: to_dtype(rstd_at(idx), cd, stat_dtype))
    return (out, mean_out, rstd)
