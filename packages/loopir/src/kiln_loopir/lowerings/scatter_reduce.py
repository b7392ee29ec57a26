"""scatter_reduce (sum/prod/mean/amax/amin, include_self or not) and index_reduce, as
gather-style masked reductions.

Instead of a scatter with a reducing store mode (the IR only has ``atomic_add``), each output
element ``out[p]`` reduces, over the scattered dim's positions ``r`` of ``index``, the source
values whose index equals ``p[dim]``: ``where(index[q] == p[dim], src[q], identity)`` with
``q = p`` but ``q[dim] = r``. A second sum counts the matches (for ``mean`` and for
``include_self=False``, where an element nothing was scattered to keeps ``self``). This is
O(numel(self) * index.size(dim)) work, deterministic, and needs only reductions, ``where`` and
``index_expr`` from a codegen. ``scatter_reduce(sum, include_self=True)`` keeps the
``atomic_add`` ScatterBuffer lowering of ``indexing.py``.
"""

from __future__ import annotations

import sympy
import torch

from ..ir.values import IRNode, Pointwise, Reduction, compute_dtype
from ..lowering import LoweringError, lowering, realize, to_dtype
from ..ops_spec import reduction_identity
from ..sizevars import statically_known_equal, sympify
from ..virtualized import ops
from .indexing import _scatter_reduce as _scatter_add_lowering

aten = torch.ops.aten
S0 = sympy.Integer(0)

_RTYPE = {"sum": "sum", "mean": "sum", "prod": "prod", "amax": "max", "amin": "min"}


def _combine(self: IRNode, reduce: str, include_self: bool, red: IRNode,
             count: IRNode | None) -> Pointwise:
    """out = self (op) reduced, as scatter_reduce/index_reduce define it."""
    dt = self.get_dtype()
    cd = compute_dtype(dt)
    sl, rl = self.make_loader(), red.make_loader()
    cl = count.make_loader() if count is not None else None

    def fn(index):
        s = to_dtype(sl(index), dt, cd)
        r = rl(index)
        if reduce == "mean":
            c = cl(index)
            if include_self:
                num, den = ops.add(s, r), ops.add(c, ops.constant(1, torch.int64))
            else:
                num, den = r, ops.maximum(c, ops.constant(1, torch.int64))
            den = ops.to_dtype(den, cd)
            v = ops.truediv(num, den) if cd.is_floating_point else ops.floordiv(num, den)
        elif reduce in ("sum", "prod"):
            v = (ops.add if reduce == "sum" else ops.mul)(s, r) if include_self else r
        else:
            v = (ops.maximum if reduce == "amax" else ops.minimum)(s, r) if include_self else r
        if not include_self:
            v = ops.where(ops.gt(cl(index), ops.constant(0, torch.int64)), v, s)
        return to_dtype(v, cd, dt)

    return Pointwise(self.get_device(), dt, self.get_size(), fn)


def masked_gather_reduce(self: IRNode, dim: int, nsrc, index_at, value_at, reduce: str,
                         include_self: bool) -> Pointwise:
    """``index_at(p, r)`` -> (int64 index value, bool valid or None); ``value_at(p, r)`` -> the
    source value (compute dtype of self) that position ``r`` contributes to output ``p``."""
    dt = self.get_dtype()
    cd = compute_dtype(dt)
    zero_dim = len(self.get_size()) == 0  # a 0-dim self is a 1-element vector
    dim_size = sympy.Integer(1) if zero_dim else sympify(self.get_size()[dim])
    rtype = _RTYPE[reduce]
    ident = reduction_identity(rtype, cd)
    fill = float(ident) if cd.is_floating_point else ident

    def match(index, r):
        iv, valid = index_at(index, r)
        iv = ops.where(ops.lt(iv, ops.constant(0, torch.int64)),
                       ops.add(iv, ops.index_expr(dim_size, torch.int64)), iv)
        m = ops.eq(iv, ops.index_expr(S0 if zero_dim else index[dim], torch.int64))
        return m if valid is None else ops.logical_and(m, valid)

    def red_fn(index, rindex):
        return ops.where(match(index, rindex[0]), value_at(index, rindex[0]), ops.constant(fill, cd))

    def count_fn(index, rindex):
        return ops.to_dtype(match(index, rindex[0]), torch.int64)

    size = list(self.get_size())
    red = realize(Reduction(self.get_device(), cd, cd, size, [nsrc], rtype, red_fn))
    count = None
    if reduce == "mean" or not include_self:
        count = realize(Reduction(self.get_device(), torch.int64, torch.int64, size, [nsrc], "sum",
                                  count_fn))
    return _combine(self, reduce, include_self, red, count)


def _check(self, reduce):
    if reduce not in _RTYPE:
        raise LoweringError(f"reduce={reduce!r}")
    if self.get_dtype() == torch.bool:
        raise LoweringError("reduction into bool")


def _copy(self):
    return Pointwise(self.get_device(), self.get_dtype(), self.get_size(), self.make_loader())


@lowering(aten.scatter_reduce.two)
def _scatter_reduce(self, dim, index, src, reduce, include_self=True):
    if reduce == "sum" and include_self:
        return _scatter_add_lowering(self, dim, index, src, reduce, include_self)
    _check(self, reduce)
    n = len(self.get_size())
    if n == 0:
        raise LoweringError("0-dim scatter_reduce")
    dim = dim % n
    isize = [sympify(s) for s in index.get_size()]
    if len(isize) != n:
        raise LoweringError("scatter_reduce with index of another rank")
    if any(s == 0 for s in isize):
        return _copy(self)
    osize = [sympify(s) for s in self.get_size()]
    il, sl = index.make_loader(), src.make_loader()
    idt, sdt = index.get_dtype(), src.get_dtype()
    cd = compute_dtype(self.get_dtype())
    partial = [k for k in range(n) if k != dim and not statically_known_equal(isize[k], osize[k])]

    def q_of(p, r):
        q = [sympy.Min(p[k], isize[k] - 1) if k in partial else p[k] for k in range(n)]
        q[dim] = r
        return q

    def index_at(p, r):
        valid = None
        for k in partial:
            c = ops.lt(ops.index_expr(p[k], torch.int64), ops.index_expr(isize[k], torch.int64))
            valid = c if valid is None else ops.logical_and(valid, c)
        return to_dtype(il(q_of(p, r)), idt, torch.int64), valid

    def value_at(p, r):
        return to_dtype(sl(q_of(p, r)), sdt, cd)

    return masked_gather_reduce(self, dim, isize[dim], index_at, value_at, reduce, include_self)


@lowering(aten.index_reduce.default)
def _index_reduce(self, dim, index, source, reduce, include_self=True):
    _check(self, reduce)
    n = len(self.get_size())
    dim = dim % n if n else 0
    if len(index.get_size()) != 1 or len(source.get_size()) != n:
        raise LoweringError("index_reduce with a non-1-D index")
    nidx = sympify(index.get_size()[0])
    if nidx == 0:
        return _copy(self)
    il, sl = index.make_loader(), source.make_loader()
    idt, sdt = index.get_dtype(), source.get_dtype()
    cd = compute_dtype(self.get_dtype())

    def index_at(p, r):
        return to_dtype(il([r]), idt, torch.int64), None

    def value_at(p, r):
        q = list(p)
        if n:
            q[dim] = r
        return to_dtype(sl(q), sdt, cd)

    return masked_gather_reduce(self, dim, nidx, index_at, value_at, reduce, include_self)


@lowering(aten.diagonal_scatter.default)
def _diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    """out = self with its (offset, dim1, dim2) diagonal replaced by src: a pointwise select."""
    size = [sympify(s) for s in self.get_size()]
    n = len(size)
    if n < 2:
        raise LoweringError("diagonal_scatter of a tensor with < 2 dims")
    d1, d2 = dim1 % n, dim2 % n
    ssize = [sympify(s) for s in src.get_size()]
    diag_len = ssize[-1] if ssize else S0
    if diag_len == 0:
        return _copy(self)
    dt = self.get_dtype()
    sl, srcl, sdt = self.make_loader(), src.make_loader(), src.get_dtype()
    rest = [k for k in range(n) if k not in (d1, d2)]

    def fn(p):
        if offset >= 0:
            on = ops.eq(ops.index_expr(p[d2], torch.int64), ops.index_expr(p[d1] + offset, torch.int64))
            i = p[d1]
        else:
            on = ops.eq(ops.index_expr(p[d1], torch.int64), ops.index_expr(p[d2] - offset, torch.int64))
            i = p[d2]
        q = [p[k] for k in rest] + [sympy.Min(i, diag_len - 1)]
        return ops.where(on, to_dtype(srcl(q), sdt, dt), sl(p))

    return Pointwise(self.get_device(), dt, size, fn)
