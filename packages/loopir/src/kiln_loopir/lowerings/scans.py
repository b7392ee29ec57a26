"""Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) as masked reductions.

The IR has no scan node, so ``out[..., i, ...] = reduce(x[..., r, ...] for r <= i)`` is a
Reduction over the whole scanned dim whose body masks the terms past ``i`` with the
reduction's identity: ``where(r <= i, x[r], identity)``. That is O(n^2) work along the scanned
dim (fine for the short dims scans usually run over; a real scan node would be O(n)), and it
needs nothing from a codegen beyond reductions, ``index_expr`` and ``where``.

cummax/cummin indices follow eager: the LAST position of the running max (a NaN wins, the
latest NaN). They are an argmax over the prefix read backwards (``x[i - r]``), whose
first-occurrence rule then picks the latest position.
"""

from __future__ import annotations

import math

import sympy
import torch

from ..ir.values import IRNode, Pointwise, Reduction, compute_dtype
from ..lowering import LoweringError, lowering, meta_val, realize, to_dtype
from ..ops_spec import reduction_identity
from ..virtualized import ops

aten = torch.ops.aten
S0 = sympy.Integer(0)


def _scan_dtype(x: IRNode, dtype) -> torch.dtype:
    if dtype is not None:
        return dtype
    m = meta_val()
    if isinstance(m, torch.Tensor):
        return m.dtype
    return torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype()


def _prefix_mask(i, r):
    """bool value: r <= i (both index exprs)."""
    return ops.le(ops.index_expr(r, torch.int64), ops.index_expr(i, torch.int64))


def masked_prefix_reduction(x: IRNode, dim: int, rtype: str, out: torch.dtype, value_fn=None,
                            reverse: bool = False) -> Reduction:
    """Reduction over x's dim ``dim`` keeping every dim: at ``i`` it reduces the terms
    ``r <= i`` (``value_fn(v, index, r)`` maps each loaded value, compute dtype of ``out``);
    ``reverse`` reads ``x[i - r]`` instead of ``x[r]``."""
    size = list(x.get_size())
    loader = x.make_loader()
    src = x.get_dtype()
    is_arg = rtype in ("argmax", "argmin")
    cd = compute_dtype(src if is_arg else out)  # the dtype of the reduced values
    ident = reduction_identity(rtype, cd)

    def inner_fn(index, rindex):
        r = rindex[0]
        full = list(index)
        i = index[dim]
        full[dim] = sympy.Max(i - r, S0) if reverse else r
        v = to_dtype(loader(full), src, cd)
        if value_fn is not None:
            v = value_fn(v, index, r)
        fill = float(ident) if cd.is_floating_point else ident
        return ops.where(_prefix_mask(i, r), v, ops.constant(fill, cd))

    return Reduction(x.get_device(), torch.int64 if is_arg else out, cd, size, [size[dim]], rtype,
                     inner_fn)


def _norm_dim(x, dim):
    n = len(x.get_size())
    return dim % n if n else 0


def _zero_dim_copy(x, out):
    loader = x.make_loader()
    src = x.get_dtype()
    return Pointwise(x.get_device(), out, [], lambda idx: to_dtype(loader(idx), src, out))


def _sum_prod_scan(rtype):
    def lower_fn(x, dim, *, dtype=None):
        out = _scan_dtype(x, dtype)
        if out == torch.bool:
            raise LoweringError(f"cumulative {rtype} into bool")
        if len(x.get_size()) == 0:
            return _zero_dim_copy(x, out)
        return masked_prefix_reduction(x, _norm_dim(x, dim), rtype, out)

    return lower_fn


lowering(aten.cumsum.default)(_sum_prod_scan("sum"))
lowering(aten.cumprod.default)(_sum_prod_scan("prod"))


def _cum_minmax(rtype):
    def lower_fn(x, dim):
        dt = x.get_dtype()
        if dt == torch.bool:
            raise LoweringError(f"cum{rtype} of bool")
        if len(x.get_size()) == 0:
            zero = Pointwise(x.get_device(), torch.int64, [], lambda idx: ops.constant(0, torch.int64))
            return (realize(_zero_dim_copy(x, dt)), realize(zero))
        d = _norm_dim(x, dim)
        vals = realize(masked_prefix_reduction(x, d, rtype, dt))
        back = realize(masked_prefix_reduction(x, d, "arg" + rtype, torch.int64, reverse=True))
        bl = back.make_loader()

        def idx_fn(index):
            return ops.sub(ops.index_expr(index[d], torch.int64), bl(index))

        return (vals, realize(Pointwise(x.get_device(), torch.int64, x.get_size(), idx_fn)))

    return lower_fn


lowering(aten.cummax.default)(_cum_minmax("max"))
lowering(aten.cummin.default)(_cum_minmax("min"))


@lowering(aten.logcumsumexp.default)
def _logcumsumexp(x, dim):
    dt = x.get_dtype()
    if not dt.is_floating_point:
        raise LoweringError("logcumsumexp of integers")
    if len(x.get_size()) == 0:
        return _zero_dim_copy(x, dt)
    d = _norm_dim(x, dim)
    cd = compute_dtype(dt)
    mx = realize(masked_prefix_reduction(x, d, "max", dt))
    ml = mx.make_loader()

    def m_at(index):
        m = to_dtype(ml(index), dt, cd)
        return ops.where(ops.eq(ops.abs(m), ops.constant(math.inf, cd)), ops.constant(0.0, cd), m)

    def shifted_exp(v, index, r):
        return ops.exp(ops.sub(v, m_at(index)))

    s = realize(masked_prefix_reduction(x, d, "sum", cd, shifted_exp))
    sl = s.make_loader()

    def out_fn(index):
        return to_dtype(ops.add(ops.log(sl(index)), m_at(index)), cd, dt)

    return Pointwise(x.get_device(), dt, x.get_size(), out_fn)
