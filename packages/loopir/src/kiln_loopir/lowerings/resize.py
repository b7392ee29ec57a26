"""Adaptive pooling with uneven windows (avg 2d/3d, max 2d/3d), as masked window reductions.

Output ``o`` of a dim of input size ``I`` and output size ``O`` pools input ``[start, end)``
with ``start = floor(o*I/O)`` and ``end = ceil((o+1)*I/O)``. The windows differ in length, so
each is a Reduction over the longest window (``kmax``, static) whose terms past ``end`` are
masked with the reduction's identity (loads are clamped into the input). Even windows keep the
plain lowerings of ``pooling.py``. Static sizes only.
"""

from __future__ import annotations

import math

import sympy
import torch

from ..ir.values import Pointwise, Reduction, compute_dtype
from ..lowering import LoweringError, lowering, realize, to_dtype
from ..sizevars import FloorDiv, sympify
from ..virtualized import ops
from . import pooling

aten = torch.ops.aten


def _windows(in_sizes, out_sizes):
    """Per spatial dim: (I, O, kmax) with static ints."""
    res = []
    for i, o in zip(in_sizes, out_sizes, strict=True):
        i, o = sympify(i), sympify(o)
        if not (i.is_Integer and o.is_Integer) or int(o) == 0:
            raise LoweringError("adaptive pooling with symbolic or empty sizes")
        i, o = int(i), int(o)
        kmax = max(-(-(k + 1) * i // o) - (k * i // o) for k in range(o))
        res.append((i, o, kmax))
    return res


def _bounds(o_idx, i, o):
    return FloorDiv(o_idx * i, o), FloorDiv((o_idx + 1) * i + o - 1, o)


def _window_reduction(x, nsp, out_size, rtype, value_dtype):
    """Reduction over the (masked) adaptive window of the last ``nsp`` dims of ``x``."""
    size = list(x.get_size())
    if any(sympify(s) == 0 for s in list(size) + list(out_size)):
        raise _Empty
    lead = len(size) - nsp
    wins = _windows(size[lead:], out_size[lead:])
    loader = x.make_loader()
    src = x.get_dtype()
    ident = {"sum": 0.0, "max": -math.inf, "argmax": -math.inf}[rtype]

    def inner_fn(index, rindex):
        full = list(index[:lead])
        mask = None
        for d, (i, o, _k) in enumerate(wins):
            start, end = _bounds(index[lead + d], i, o)
            pos = start + rindex[d]
            full.append(sympy.Min(pos, i - 1))
            c = ops.lt(ops.index_expr(pos, torch.int64), ops.index_expr(end, torch.int64))
            mask = c if mask is None else ops.logical_and(mask, c)
        v = to_dtype(loader(full), src, value_dtype)
        return ops.where(mask, v, ops.constant(ident, value_dtype))

    out_dtype = torch.int64 if rtype == "argmax" else value_dtype
    red = Reduction(x.get_device(), out_dtype, value_dtype, list(out_size),
                    [k for _, _, k in wins], rtype, inner_fn)
    return realize(red), wins


class _Empty(Exception):
    """An empty input or output: nothing to reduce (the result is an empty tensor)."""


def _empty(x, dtype, out_size):
    return Pointwise(x.get_device(), dtype, out_size, lambda idx: ops.constant(0, dtype))


def _adaptive_window(x, nsp: int, op: str, rtype: str):
    """An adaptive pooling's window reduction ``rtype`` over floats: (dtype, compute dtype,
    output size, the realized reduction, its windows); the reduction is None for an empty
    output (an empty tensor). An empty input with a non-empty output has no window to reduce
    (torch raises): refused."""
    dt = pooling._float_dtype(x, op)
    _, out_size = pooling._out_meta()
    cd = compute_dtype(dt)
    try:
        red, wins = _window_reduction(x, nsp, out_size, rtype, cd)
    except _Empty:
        if not any(sympify(v) == 0 for v in out_size):
            raise LoweringError(f"{op} of an empty input") from None
        return dt, cd, out_size, None, None
    return dt, cd, out_size, red, wins


def _adaptive_avg(x, output_size, nsp):
    dt, cd, out_size, s, wins = _adaptive_window(x, nsp, "adaptive_avg_pool", "sum")
    if s is None:
        return _empty(x, dt, out_size)
    sl = s.make_loader()
    lead = len(out_size) - nsp

    def fn(index):
        n = sympy.Integer(1)
        for d, (i, o, _k) in enumerate(wins):
            start, end = _bounds(index[lead + d], i, o)
            n = n * (end - start)
        cnt = ops.to_dtype(ops.index_expr(n, torch.int64), cd)
        return to_dtype(ops.truediv(sl(index), cnt), cd, dt)

    return Pointwise(x.get_device(), dt, out_size, fn)


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(x, output_size):
    try:
        return pooling._adaptive_avg_pool2d(x, output_size)
    except LoweringError:
        return _adaptive_avg(x, output_size, 2)


@lowering(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, output_size, 3)


def _adaptive_max(x, output_size, nsp):
    dt, cd, out_size, vals, wins = _adaptive_window(x, nsp, "adaptive_max_pool", "max")
    if vals is None:
        return (realize(_empty(x, dt, out_size)), realize(_empty(x, torch.int64, out_size)))
    arg, _ = _window_reduction(x, nsp, out_size, "argmax", cd)
    vl, al = vals.make_loader(), arg.make_loader()
    lead = len(out_size) - nsp

    def values_fn(index):
        return to_dtype(vl(index), cd, dt)

    def indices_fn(index):
        """flat input position (over the spatial dims) of the window's linear argmax."""
        lin = al(index)
        flat = None
        inner = 1
        for d in reversed(range(nsp)):
            i, o, k = wins[d]
            a = ops.remainder(ops.floordiv(lin, ops.constant(inner, torch.int64)), ops.constant(k, torch.int64))
            inner *= k
            start, _ = _bounds(index[lead + d], i, o)
            pos = ops.add(ops.index_expr(start, torch.int64), a)
            stride = math.prod(w[0] for w in wins[d + 1:])
            term = ops.mul(pos, ops.constant(stride, torch.int64))
            flat = term if flat is None else ops.add(flat, term)
        return flat

    return (realize(Pointwise(x.get_device(), dt, out_size, values_fn)),
            realize(Pointwise(x.get_device(), torch.int64, out_size, indices_fn)))


@lowering(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, output_size, 2)


@lowering(aten.adaptive_max_pool3d.default)
def _adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, output_size, 3)
