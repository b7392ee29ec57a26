"""Data movement and indexing: cat, constant_pad_nd, index, gather, index_select, embedding.

Loads that may fall outside their tensor (the other side of a cat, the pad region) use
clamped indices (``Min``/``Max`` in the index expression) and ``ops.where`` selects the value,
so every load of the IR is in bounds. Tensor indices become ``ops.indirect_indexing`` symbols.
"""

from __future__ import annotations

import sympy
import torch

from ..ir.values import ComputedBuffer, Layout, Pointwise, ScatterBuffer
from ..lowering import (
    LoweringError,
    as_storage_view,
    broadcast_loader,
    broadcast_shapes,
    constant_value,
    current,
    is_dense,
    lowering,
    make_extern,
    meta_val,
    realize,
    to_dtype,
)
from ..sizevars import FloorDiv, contiguous_strides, sympify
from ..virtualized import ops
from .extern import _VIEW_OPS, EXTERN_OPS

aten = torch.ops.aten
S0 = sympy.Integer(0)

MAX_CAT_INPUTS = 8


def _meta_size():
    m = meta_val()
    if isinstance(m, torch.Tensor):
        g = current()
        return m, [g.expr(s) for s in m.shape]
    raise LoweringError("needs a tensor meta value")


@lowering(aten.cat.default)
def _cat(tensors, dim=0):
    m, out_size = _meta_size()
    dtype = m.dtype
    n = len(out_size)
    dim = dim % n if n else 0
    parts = []
    offset = S0
    for t in tensors:
        size = [sympify(s) for s in t.get_size()]
        if len(size) == 1 and size[0] == 0 and n != 1:
            continue  # legacy empty tensor
        length = size[dim]
        if length == 0:
            continue
        parts.append((t, offset, length))
        offset = offset + length
    if not parts:
        raise LoweringError("cat of empty tensors")
    if len(parts) > MAX_CAT_INPUTS and _mostly_stored(parts):
        return _cat_of_stored(parts, dim, m)
    if len(parts) > MAX_CAT_INPUTS or _rows_into_slices(parts, dim, n):
        return _cat_into_slices(parts, out_size, dim, dtype)
    if len(parts) == 1:
        t = parts[0][0]
        loader = t.make_loader()
        return Pointwise(t.get_device(), dtype, out_size,
                         lambda idx: to_dtype(loader(idx), t.get_dtype(), dtype))
    loaders = [(broadcast_loader(t, [sympify(s) for s in t.get_size()]), t.get_dtype(), off, ln)
               for t, off, ln in parts]
    device = parts[0][0].get_device()

    def inner_fn(index):
        i = index[dim]
        value = None
        for k in range(len(loaders) - 1, -1, -1):
            ld, dt, off, ln = loaders[k]
            local = i - off
            if k > 0:
                local = sympy.Max(local, S0)
            if k < len(loaders) - 1:
                local = sympy.Min(local, ln - 1)
            idx = list(index)
            idx[dim] = local
            v = to_dtype(ld(idx), dt, dtype)
            if value is None:
                value = v
            else:
                cond = ops.lt(ops.index_expr(i, torch.int64), constant_value(off + ln, torch.int64))
                value = ops.where(cond, v, value)
        return value

    return Pointwise(device, dtype, out_size, inner_fn)


def _mostly_stored(parts) -> bool:
    """DenseNet's concatenations: every part but a few (the block's pooled input) is already
    in memory, a convolution's result (``as_storage_view``), so copying each part into its
    slice is a launch per part with nothing fused into it (430 copy launches a call in
    densenet121, host-bound on a GPU)."""
    loops = sum(as_storage_view(t) is None for t, _, _ in parts)
    return loops * 4 <= len(parts)


def _cat_of_stored(parts, dim: int, meta):
    """One ``aten.cat`` call for a cat of many stored parts (eager's batched copy: one launch
    on a GPU, one pass on a CPU); the few parts still loops are realized first."""
    tensors = [realize(t) for t, _, _ in parts]
    return make_extern(aten.cat.default, [tensors, dim], {}, meta, fallback=False)


#: a cat along the innermost dim whose parts each have at least this many elements per row
#: copies each part into its slice (``_rows_into_slices``)
MIN_SLICE_ROW = 16


def _rows_into_slices(parts, dim: int, ndim: int) -> bool:
    """A cat along the innermost dim whose result is stored anyway (an extern call or the
    graph's output reads it): one loop per part writing its slice of each row reads each part
    once, contiguously, where the ``where`` chain loads every part at every element through
    clamped indices (a transformer block's backward: the q, k, v grads into one row of
    ``3 d``, 0.43 ms against eager's 0.39 ms). Parts of at least ``MIN_SLICE_ROW`` elements:
    shorter rows are left to the chain."""
    if len(parts) < 2 or dim != ndim - 1:
        return False
    if not all(sympify(length).is_Integer and int(length) >= MIN_SLICE_ROW for _, _, length in parts):
        return False
    node = current().current_node
    return node is not None and node.target is aten.cat.default and _stored_by_users(node)


def _stored_by_users(node) -> bool:
    """Does an extern call or the graph's output read ``node`` (looking through views)?"""
    if node is None:
        return False
    for u in node.users:
        if u.op == "output" or (u.op == "call_function" and u.target in _STORING_OPS):
            return True
        if u.op == "call_function" and u.target in _VIEWS and _stored_by_users(u):
            return True
    return False


_STORING_OPS = frozenset([*EXTERN_OPS, aten.mm.default, aten.addmm.default, aten.convolution.default])
_VIEWS = (*_VIEW_OPS, aten.permute.default)


def _cat_into_slices(parts, out_size, dim: int, dtype):
    """A cat of many inputs (DenseNet's blocks concatenate up to ~30): one loop per input
    copying it into its slice of the result (a where-chain over all inputs would load every
    input at every element). The first loop owns the result buffer, the others are
    ScatterBuffers writing into it; each input's pointwise producer fuses into its loop."""
    g = current()
    m = meta_val()
    stride = [g.expr(st) for st in m.stride()]
    if not is_dense(out_size, stride):
        stride = contiguous_strides(out_size)
    device = parts[0][0].get_device()
    target = None
    for t, off, _ in parts:
        loader, t_dt = t.make_loader(), t.get_dtype()
        data = Pointwise(device, dtype, [sympify(s) for s in t.get_size()],
                         lambda idx, ld=loader, dt=t_dt: to_dtype(ld(idx), dt, dtype))
        if target is None:  # fills the first slice (offset 0) of the result's layout
            target = ComputedBuffer(g.graph.new_name(), Layout(device, dtype, out_size, stride), data)
            g.graph.register_buffer(target)
            continue

        def out_indexer(idx, off=off):
            return [i + off if k == dim else i for k, i in enumerate(idx)]

        g.graph.register_buffer(ScatterBuffer(g.graph.new_name(), target, data, out_indexer, None))
    return target


@lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(x, pad, value=0):
    m, out_size = _meta_size()
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    loader = x.make_loader()
    dtype = x.get_dtype()
    pads = {}
    for k in range(len(pad) // 2):
        d = n - 1 - k
        pads[d] = (sympify(pad[2 * k]), sympify(pad[2 * k + 1]))

    def inner_fn(index):
        idx = list(index)
        conds = []
        for d, (left, right) in pads.items():
            src = index[d] - left
            lo_ok = left <= 0 if left.is_Integer else False
            hi_ok = right <= 0 if right.is_Integer else False
            e = src
            if not lo_ok:
                e = sympy.Max(e, S0)
                conds.append(ops.ge(ops.index_expr(index[d], torch.int64), constant_value(left, torch.int64)))
            if not hi_ok:
                e = sympy.Min(e, size[d] - 1)
                conds.append(ops.lt(ops.index_expr(index[d], torch.int64),
                                    constant_value(left + size[d], torch.int64)))
            idx[d] = e
        v = loader(idx)
        if not conds:
            return v
        c = conds[0]
        for c2 in conds[1:]:
            c = ops.logical_and(c, c2)
        return ops.where(c, v, constant_value(value, dtype))

    return Pointwise(x.get_device(), dtype, out_size, inner_fn)



class _AdvancedIndex:
    """What ``index`` and ``index_put`` both derive from their index tensors: ``x``'s sizes,
    the indices padded with ``None`` to its rank, the positions of the tensors (``pos``), their
    broadcast shape, whether they are adjacent (then the indexed block stays in place; torch
    puts it first otherwise) and the plain dims before and after it. A mask (data-dependent
    size) is refused with ``mask_error``; a non-empty ``refuse`` is raised after that check."""

    def __init__(self, x, indices, mask_error: str, op: str, refuse: str = ""):
        self.size = [sympify(s) for s in x.get_size()]
        n = self.n = len(self.size)
        indices = self.indices = list(indices) + [None] * (n - len(indices))
        for t in indices:
            if t is not None and t.get_dtype() in (torch.bool, torch.uint8):
                raise LoweringError(mask_error)
        if refuse:
            raise LoweringError(refuse)
        pos = self.pos = [k for k, t in enumerate(indices) if t is not None]
        if not pos:
            raise LoweringError(f"{op} without tensors")
        self.bshape = broadcast_shapes(*[indices[k].get_size() for k in pos])
        self.adjacent = pos == list(range(pos[0], pos[-1] + 1))
        self.before = list(range(pos[0])) if self.adjacent else []
        self.rest = [k for k in range(n) if k not in pos and k not in self.before]
        self.iloaders = {k: (broadcast_loader(indices[k], self.bshape), indices[k].get_dtype())
                         for k in pos}

    def ranges(self) -> list:
        """The iteration space: the broadcast block in its place among the plain dims."""
        size = self.size
        if self.adjacent:
            return [size[k] for k in self.before] + list(self.bshape) + [size[k] for k in self.rest]
        return list(self.bshape) + [size[k] for k in self.rest]

    def source_index(self, index) -> list:
        """``x``'s index for an index of the iteration space: plain dims copied, indexed dims
        read from the index tensors."""
        index, nb = list(index), len(self.bshape)
        if self.adjacent:
            k = len(self.before)
            b_idx, others, other_dims = index[k:k + nb], index[:k] + index[k + nb:], \
                self.before + self.rest
        else:
            b_idx, others, other_dims = index[:nb], index[nb:], self.rest
        full = [S0] * self.n
        for d, i in zip(other_dims, others, strict=False):
            full[d] = i
        for k in self.pos:
            ld, dt = self.iloaders[k]
            full[k] = _indirect(ld, dt, b_idx, self.size[k])
        return full


def _indirect(index_loader, index_dtype, idx, size):
    v = index_loader(idx)
    if index_dtype != torch.int64:
        v = ops.to_dtype(v, torch.int64)
    return ops.indirect_indexing(v, size)


@lowering(aten.index.Tensor)
def _index(x, indices):
    m, out_size = _meta_size()
    plan = _AdvancedIndex(x, indices, "boolean mask indexing (data-dependent size)", "index")
    loader = x.make_loader()

    def inner_fn(index):
        return loader(plan.source_index(index))

    return Pointwise(x.get_device(), x.get_dtype(), out_size, inner_fn)


def _along_dim(x, dim, index):
    """What gather and index_select read along ``dim``: x's sizes and rank, ``dim``
    normalized (0 for a 0-d x), x's loader, the index's loader and dtype."""
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    return size, n, dim % n if n else 0, x.make_loader(), index.make_loader(), index.get_dtype()


@lowering(aten.gather.default)
def _gather(x, dim, index, sparse_grad=False):
    size, n, dim, loader, iloader, idt = _along_dim(x, dim, index)

    def inner_fn(idx):
        full = list(idx)
        if n:
            full[dim] = _indirect(iloader, idt, list(idx), size[dim])
        return loader(full)

    return Pointwise(x.get_device(), x.get_dtype(), index.get_size(), inner_fn)


@lowering(aten.index_select.default)
def _index_select(x, dim, index):
    m, out_size = _meta_size()
    size, n, dim, loader, iloader, idt = _along_dim(x, dim, index)
    scalar_index = len(index.get_size()) == 0

    def inner_fn(idx):
        full = list(idx)
        if n:
            full[dim] = _indirect(iloader, idt, [] if scalar_index else [idx[dim]], size[dim])
        return loader(full)

    return Pointwise(x.get_device(), x.get_dtype(), out_size, inner_fn)


@lowering(aten.embedding.default)
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if len(weight.get_size()) != 2:
        raise LoweringError("embedding weight must be 2-D")
    m, out_size = _meta_size()
    wl = weight.make_loader()
    il = indices.make_loader()
    idt = indices.get_dtype()
    nb = len(indices.get_size())
    rows = sympify(weight.get_size()[0])

    def inner_fn(idx):
        r = _indirect(il, idt, list(idx[:nb]), rows)
        return wl([r, idx[nb]])

    return Pointwise(weight.get_device(), weight.get_dtype(), out_size, inner_fn)


# ---- *_scatter as pointwise selects -------------------------------------------------------------


@lowering(aten.slice_scatter.default)
def _slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    size = [sympify(s) for s in self.get_size()]
    n = len(size)
    dim = dim % n if n else 0
    src_size = [sympify(s) for s in src.get_size()]
    length = src_size[dim]
    start = sympify(0 if start is None else start)
    if start.is_Integer and int(start) < 0:
        start = size[dim] + start
    step = sympify(step)
    sl = self.make_loader()
    srcl = src.make_loader()
    dtype = self.get_dtype()
    s_dt = src.get_dtype()

    def inner_fn(index):
        i = index[dim]
        local = sympy.Max(i - start, S0)
        if step != 1:
            local = FloorDiv(local, step)
        local = sympy.Min(local, length - 1)
        sidx = list(index)
        sidx[dim] = local
        iv = ops.index_expr(i, torch.int64)
        cond = ops.logical_and(ops.ge(iv, constant_value(start, torch.int64)),
                               ops.lt(iv, constant_value(start + length * step - (step - 1), torch.int64)))
        if step != 1:
            rem = ops.remainder(ops.sub(iv, constant_value(start, torch.int64)), constant_value(step, torch.int64))
            cond = ops.logical_and(cond, ops.eq(rem, ops.constant(0, torch.int64)))
        return ops.where(cond, to_dtype(srcl(sidx), s_dt, dtype), sl(index))

    return Pointwise(self.get_device(), dtype, size, inner_fn)


@lowering(aten.select_scatter.default)
def _select_scatter(self, src, dim, index):
    size = [sympify(s) for s in self.get_size()]
    n = len(size)
    dim = dim % n
    index = sympify(index)
    if index.is_Integer and int(index) < 0:
        index = size[dim] + index
    sl, srcl = self.make_loader(), src.make_loader()
    dtype, s_dt = self.get_dtype(), src.get_dtype()

    def inner_fn(idx):
        sidx = list(idx[:dim]) + list(idx[dim + 1:])
        cond = ops.eq(ops.index_expr(idx[dim], torch.int64), constant_value(index, torch.int64))
        return ops.where(cond, to_dtype(srcl(sidx), s_dt, dtype), sl(idx))

    return Pointwise(self.get_device(), dtype, size, inner_fn)


# ---- scatters: a copy of self, then a ScatterBuffer writing into it ------------------------------


def _scatter_into(self, ranges, value_fn, out_indexer, mode):
    g = current()
    copy = Pointwise(self.get_device(), self.get_dtype(), self.get_size(), self.make_loader())
    target = realize(copy)
    data = Pointwise(self.get_device(), self.get_dtype(), ranges, value_fn)
    sb = ScatterBuffer(g.graph.new_name(), target, data, out_indexer, mode)
    g.graph.register_buffer(sb)
    return target


def _scatter_common(self, dim, index, src, mode, value=None):
    n = len(self.get_size())
    dim = dim % n if n else 0
    dtype = self.get_dtype()
    il = index.make_loader()
    idt = index.get_dtype()
    size = [sympify(s) for s in self.get_size()]
    if src is not None:
        sl = src.make_loader()
        s_dt = src.get_dtype()

        def value_fn(idx):
            return to_dtype(sl(idx), s_dt, dtype)
    else:
        def value_fn(idx):
            return constant_value(value, dtype)

    def out_indexer(idx):
        out = list(idx)
        if n:
            out[dim] = _indirect(il, idt, list(idx), size[dim])
        return out

    ranges = index.get_size()
    return _scatter_into(self, ranges, value_fn, out_indexer, mode)


@lowering(aten.scatter.src)
def _scatter_src(self, dim, index, src):
    if len(index.get_size()) == 0 or any(sympify(s) == 0 for s in index.get_size()):
        raise LoweringError("degenerate scatter")
    return _scatter_common(self, dim, index, src, None)


@lowering(aten.scatter.value)
def _scatter_value(self, dim, index, value):
    if len(index.get_size()) == 0:
        raise LoweringError("degenerate scatter")
    return _scatter_common(self, dim, index, None, None, value)


@lowering(aten.scatter_add.default)
def _scatter_add(self, dim, index, src):
    if len(index.get_size()) == 0 or self.get_dtype() == torch.bool:
        raise LoweringError("degenerate scatter_add")
    return _scatter_common(self, dim, index, src, "atomic_add")


def _scatter_reduce(self, dim, index, src, reduce, include_self=True):
    """scatter_reduce(sum, include_self) as an atomic-add scatter (``scatter_reduce.py``
    registers the lowering and calls this)."""
    if reduce != "sum" or not include_self:
        raise LoweringError(f"scatter_reduce {reduce}")
    return _scatter_add(self, dim, index, src)


@lowering(aten.index_put.default)
def _index_put(self, indices, values, accumulate=False):
    plan = _AdvancedIndex(
        self, indices, "boolean mask index_put", "index_put",
        refuse="accumulate into bool" if accumulate and self.get_dtype() == torch.bool else "")
    ranges = plan.ranges()
    vl = broadcast_loader(values, ranges)
    v_dt = values.get_dtype()
    dtype = self.get_dtype()

    def value_fn(index):
        return to_dtype(vl(index), v_dt, dtype)

    return _scatter_into(self, ranges, value_fn, plan.source_index,
                         "atomic_add" if accumulate else None)
