"""Pooling: max_pool2d_with_indices, avg_pool2d, _adaptive_avg_pool2d.

Small windows (at most ``MAX_UNROLL`` elements) are unrolled in a pointwise body (clamped
loads, ``where`` for padding); large windows without padding become a Reduction over the
window (global average pooling is a mean over H, W)."""

from __future__ import annotations

import math

import sympy
import torch

from ..ir.values import Pointwise, Reduction, compute_dtype
from ..lowering import LoweringError, current, lowering, meta_val, realize, to_dtype
from ..sizevars import sympify
from ..virtualized import ops

aten = torch.ops.aten
S0 = sympy.Integer(0)
MAX_UNROLL = 25


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, (list, tuple)):
        return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])
    return (v, v)


def _out_meta():
    m = meta_val()
    g = current()
    if isinstance(m, (tuple, list)):
        m = m[0]
    if not isinstance(m, torch.Tensor):
        raise LoweringError("pooling needs meta")
    return m, [g.expr(s) for s in m.shape]


def _check_int(*vals):
    for v in vals:
        if not isinstance(v, int):
            raise LoweringError("pooling with symbolic window parameters")


def _float_dtype(x, op: str) -> torch.dtype:
    """``x``'s dtype; pooling of integers is refused (an aten fallback)."""
    dt = x.get_dtype()
    if not dt.is_floating_point:
        raise LoweringError(f"{op} of integers")
    return dt


def _window(kernel_size, stride, padding):
    """(kernel, stride, padding) pairs; the stride defaults to the kernel."""
    kh, kw = _pair(kernel_size)
    return (kh, kw), _pair(stride, (kh, kw)), _pair(padding)


def _iv(e):
    return ops.index_expr(sympify(e), torch.int64)


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    dt = _float_dtype(x, "max_pool2d")
    (kh, kw), (sh, sw), (ph, pw) = _window(kernel_size, stride, padding)
    dh, dw = _pair(dilation)
    _check_int(kh, kw, sh, sw, ph, pw, dh, dw)
    if kh * kw > MAX_UNROLL:
        raise LoweringError("large max_pool window")
    m, out_size = _out_meta()
    size = [sympify(s) for s in x.get_size()]
    H, W = size[-2], size[-1]
    loader = x.make_loader()
    cd = compute_dtype(dt)
    lead = len(size) - 2

    def window(index):
        oh, ow = index[lead], index[lead + 1]
        for a in range(kh):
            for b in range(kw):
                h = oh * sh - ph + a * dh
                w = ow * sw - pw + b * dw
                hc = sympy.Min(sympy.Max(h, S0), H - 1) if ph or ceil_mode else sympy.Min(h, H - 1)
                wc = sympy.Min(sympy.Max(w, S0), W - 1) if pw or ceil_mode else sympy.Min(w, W - 1)
                v = loader(list(index[:lead]) + [hc, wc])
                conds = []
                if ph or ceil_mode:
                    hi = _iv(h)
                    conds += [ops.ge(hi, ops.constant(0, torch.int64)), ops.lt(hi, _iv(H))]
                if pw or ceil_mode:
                    wi = _iv(w)
                    conds += [ops.ge(wi, ops.constant(0, torch.int64)), ops.lt(wi, _iv(W))]
                c = None
                for cc in conds:
                    c = cc if c is None else ops.logical_and(c, cc)
                yield v, c, h * W + w

    def values_fn(index):
        best = ops.constant(-math.inf, cd)
        for v, c, _ in window(index):
            if c is not None:
                v = ops.where(c, v, ops.constant(-math.inf, cd))
            best = ops.maximum(best, v)
        return to_dtype(best, cd, dt)

    def indices_fn(index):
        best = ops.constant(-math.inf, cd)
        oh, ow = index[lead], index[lead + 1]
        h0 = sympy.Max(oh * sh - ph, S0) if ph else oh * sh
        w0 = sympy.Max(ow * sw - pw, S0) if pw else ow * sw
        idx = _iv(h0 * W + w0)
        for v, c, flat in window(index):
            upd = ops.logical_or(ops.gt(v, best), ops.isnan(v))
            if c is not None:
                upd = ops.logical_and(upd, c)
            best = ops.where(upd, v, best)
            idx = ops.where(upd, _iv(flat), idx)
        return idx

    vals = Pointwise(x.get_device(), dt, out_size, values_fn)
    idxs = Pointwise(x.get_device(), torch.int64, out_size, indices_fn)
    return (vals, idxs)


def _sum_window_reduction(x, out_size, kh, kw, sh, sw, cd):
    """Reduction summing the kh x kw window (no padding) at each output position."""
    loader = x.make_loader()
    lead = len(x.get_size()) - 2
    src = x.get_dtype()

    def inner_fn(index, rindex):
        oh, ow = index[lead], index[lead + 1]
        v = loader(list(index[:lead]) + [oh * sh + rindex[0], ow * sw + rindex[1]])
        return to_dtype(v, src, cd) if compute_dtype(src) != cd else v

    return realize(Reduction(x.get_device(), cd, cd, out_size, [kh, kw], "sum", inner_fn))


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    dt = _float_dtype(x, "avg_pool2d")
    (kh, kw), (sh, sw), (ph, pw) = _window(kernel_size, stride, padding)
    _check_int(kh, kw, sh, sw, ph, pw)
    m, out_size = _out_meta()
    size = [sympify(s) for s in x.get_size()]
    H, W = size[-2], size[-1]
    lead = len(size) - 2
    cd = compute_dtype(dt)
    if ph == 0 and pw == 0 and not ceil_mode:
        if kh * kw > MAX_UNROLL:
            s = _sum_window_reduction(x, out_size, kh, kw, sh, sw, cd)
            sl = s.make_loader()
            div = float(divisor_override or kh * kw)
            return Pointwise(x.get_device(), dt, out_size,
                             lambda idx: to_dtype(ops.truediv(sl(idx), ops.constant(div, cd)), cd, dt))
    if kh * kw > MAX_UNROLL:
        raise LoweringError("large padded avg_pool window")
    loader = x.make_loader()

    def fn(index):
        oh, ow = index[lead], index[lead + 1]
        total = ops.constant(0.0, cd)
        for a in range(kh):
            for b in range(kw):
                h = oh * sh - ph + a
                w = ow * sw - pw + b
                v = loader(list(index[:lead]) + [sympy.Min(sympy.Max(h, S0), H - 1),
                                                  sympy.Min(sympy.Max(w, S0), W - 1)])
                v = to_dtype(v, dt, cd) if compute_dtype(dt) != cd else v
                hi, wi = _iv(h), _iv(w)
                c = ops.logical_and(ops.logical_and(ops.ge(hi, ops.constant(0, torch.int64)), ops.lt(hi, _iv(H))),
                                    ops.logical_and(ops.ge(wi, ops.constant(0, torch.int64)), ops.lt(wi, _iv(W))))
                total = ops.add(total, ops.where(c, v, ops.constant(0.0, cd)))
        if divisor_override:
            div = ops.constant(float(divisor_override), cd)
        else:
            hs, ws = oh * sh - ph, ow * sw - pw
            he, we = sympy.Min(hs + kh, H + ph), sympy.Min(ws + kw, W + pw)
            if count_include_pad:
                n = (he - hs) * (we - ws)
            else:
                n = (sympy.Min(he, H) - sympy.Max(hs, S0)) * (sympy.Min(we, W) - sympy.Max(ws, S0))
            div = ops.to_dtype(ops.index_expr(n, torch.int64), cd)
        return to_dtype(ops.truediv(total, div), cd, dt)

    return Pointwise(x.get_device(), dt, out_size, fn)


def _adaptive_avg_pool2d(x, output_size):
    """The 1x1 / evenly dividing cases (``resize._adaptive_avg_pool2d`` is the lowering)."""
    dt = x.get_dtype()
    if not dt.is_floating_point:
        raise LoweringError("adaptive_avg_pool2d of integers")
    size = [sympify(s) for s in x.get_size()]
    H, W = size[-2], size[-1]
    oh, ow = (sympify(v) for v in _pair(output_size))
    m, out_size = _out_meta()
    cd = compute_dtype(dt)
    if oh == 1 and ow == 1:
        kh, kw = H, W
    elif all(v.is_Integer for v in (H, W, oh, ow)) and int(H) % int(oh) == 0 and int(W) % int(ow) == 0:
        kh, kw = int(H) // int(oh), int(W) // int(ow)
    else:
        raise LoweringError("adaptive pooling with uneven windows")
    if isinstance(kh, int) and isinstance(kw, int) and kh * kw <= MAX_UNROLL:
        return _avg_pool2d(x, [kh, kw], [kh, kw], 0, False, True, None)
    s = _sum_window_reduction(x, out_size, kh, kw, kh, kw, cd)
    sl = s.make_loader()
    n = sympify(kh) * sympify(kw)

    def fn(idx):
        if n.is_Integer:
            d = ops.constant(float(n), cd)
        else:
            d = ops.to_dtype(ops.index_expr(n, torch.int64), cd)
        return to_dtype(ops.truediv(sl(idx), d), cd, dt)

    return Pointwise(x.get_device(), dt, out_size, fn)
