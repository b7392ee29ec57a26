"""View lowerings: views fold into index arithmetic.

A view of a storage-backed value (input, extern output, realized buffer, or a strided view of
one) is a ``ReinterpretView`` (new size/stride/offset over the same storage). A view of an
unrealized loop (``Pointwise``) or a view that is not strided (a reshape of a non-contiguous
tensor, flip, repeat) is a ``GenericView`` whose ``reindex`` maps the view's index to the
base's index. Either way, loads in the final IR index the base storage directly.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from ..ir.values import GenericView, IRNode, Layout, Pointwise, ReinterpretView
from ..lowering import (
    LoweringError,
    as_storage_view,
    aten_ops,
    current,
    has_eager_strides,
    is_dense,
    lowering,
    meta_val,
    realize,
)
from ..sizevars import (
    FloorDiv,
    ModularIndexing,
    contiguous_strides,
    statically_known_equal,
    sympify,
)

aten = torch.ops.aten
S0 = sympy.Integer(0)
S1 = sympy.Integer(1)


def _norm_dim(d, ndim):
    if ndim == 0:
        return 0
    return d % ndim if d < 0 else d


def _meta_size():
    m = meta_val()
    if isinstance(m, torch.Tensor):
        g = current()
        return [g.expr(s) for s in m.shape]
    return None


def _view(x: IRNode, size, stride_fn, reindex) -> IRNode:
    """Make a view: strided over storage when ``x`` has storage, else a GenericView."""
    sv = as_storage_view(x)
    if sv is not None and stride_fn is not None:
        lay = sv.layout
        res = stride_fn(list(lay.size), list(lay.stride), lay.offset)
        if res is not None:
            stride, offset = res
            return ReinterpretView(sv.data, Layout(lay.device, lay.dtype, size, stride, offset))
    if isinstance(x, Pointwise) and stride_fn is not None:
        return ViewOfLoop(x, size, reindex, stride_fn)
    if isinstance(x, ViewOfLoop) and stride_fn is not None:
        return x.then(size, reindex, stride_fn)
    return GenericView(x, size, reindex)


class ViewOfLoop(GenericView):
    """A strided view (reshape, permute, ...) of a loop not yet realized when the view was
    made. Realizing it realizes the loop itself and views that buffer when the view comes out
    in the layout asked for (default contiguous; any, if the loop already has a buffer and no
    layout is asked for), so that several views of one value (the
    normalized hidden state under the q, k and v projections' ``view``) share one buffer
    instead of each writing a copy."""

    def __init__(self, data: Pointwise, size, reindex, stride_fn):
        super().__init__(data, size, reindex)
        self.stride_fn = stride_fn

    def then(self, size, reindex, stride_fn) -> ViewOfLoop:
        """A view of this view, kept a view of the same loop: a chain (``mul.view(..).t()``, a
        weight gradient's operand) realizes as a strided view of the loop's one buffer, not
        as a transposed copy of it."""
        inner_size, inner_reindex, inner_stride_fn = list(self.size), self.reindex, self.stride_fn

        def composed_stride_fn(sz, st, off):
            inner = inner_stride_fn(sz, st, off)
            return None if inner is None else stride_fn(list(inner_size), list(inner[0]), inner[1])

        return ViewOfLoop(self.data, size, lambda index: inner_reindex(reindex(index)),
                          composed_stride_fn)

    def realize_via_base(self, stride=None) -> ReinterpretView | None:
        """The view over the loop's buffer (realizing the loop), or None where that would not
        be the contiguous (or requested) layout a copy would get, or would compute elements
        the view does not have."""
        base = self.data
        if base.realized is None:
            bsize = list(base.get_size())
            if sympy.simplify(sympy.Mul(*bsize) - sympy.Mul(*self.size)) != 0:
                return None  # a part of the loop (a slice): realizing all of it does more work
            res = self.stride_fn(list(bsize), list(contiguous_strides(bsize)), S0)
            want = list(contiguous_strides(self.size)) if stride is None else list(stride)
            if res is None or res[1] != 0 or [sympify(e) for e in res[0]] != [sympify(e) for e in want]:
                return None
        return self._over_base_buffer(stride)

    def broadcast_via_base(self) -> ReinterpretView | None:
        """A broadcast of the loop (an ``expand``: a dim of stride 0) as a view of the loop's
        own buffer, for an extern's input: eager hands the op that same stride-0 view (an
        attention mask expanded over the heads), where a copy is as large as the broadcast
        (BERT-base's mask: 50 MB per layer, written and read again). None when the view has
        no broadcast dim, or when realizing the whole loop would cost more than the copy."""
        base = self.data
        bsize = list(base.get_size())
        res = self.stride_fn(bsize, list(contiguous_strides(bsize)), S0)
        if res is None or not any(sympify(st) == 0 and sympify(n) != 1
                                  for st, n in zip(res[0], self.size, strict=True)):
            return None
        if base.realized is None:
            extra = sympy.simplify(sympy.Mul(*bsize) - sympy.Mul(*self.size))
            if extra.is_nonpositive is not True:  # the loop has more elements than the broadcast
                return None
        return self._over_base_buffer()

    def _over_base_buffer(self, stride=None) -> ReinterpretView | None:
        """Realize the loop and map this view over its buffer: None where the view is no
        strided view of it, or comes out in another layout than ``stride`` when one is asked
        for (a caller asking for a layout, as_strided or channels-last, gets it)."""
        sv = as_storage_view(realize(self.data))
        res = None if sv is None else self.stride_fn(list(sv.layout.size), list(sv.layout.stride),
                                                     sv.layout.offset)
        if res is None or (stride is not None
                           and [sympify(e) for e in res[0]] != [sympify(e) for e in stride]):
            return None
        lay = sv.layout
        return ReinterpretView(sv.data, Layout(lay.device, lay.dtype, self.size, res[0], res[1]))


# ---- permute / transpose ----------------------------------------------------------------------


@lowering(*aten_ops("permute.default", "permute_copy.default"))
def permute(x, dims):
    n = len(x.get_size())
    dims = [_norm_dim(d, n) for d in dims]
    size = [x.get_size()[d] for d in dims]
    inv = [0] * n
    for k, d in enumerate(dims):
        inv[d] = k

    def stride_fn(sz, st, off):
        return [st[d] for d in dims], off

    def reindex(index):
        return [index[inv[k]] for k in range(n)]

    return _view(x, size, stride_fn, reindex)


@lowering(*aten_ops("transpose.int", "transpose_copy.int"))
def transpose(x, dim0, dim1):
    n = len(x.get_size())
    if n == 0:
        return x
    dims = list(range(n))
    a, b = _norm_dim(dim0, n), _norm_dim(dim1, n)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


@lowering(*aten_ops("t.default", "t_copy.default"))
def t(x):
    if len(x.get_size()) < 2:
        return x
    return permute(x, [1, 0])


# ---- expand ---------------------------------------------------------------------------------------


@lowering(*aten_ops("expand.default", "expand_copy.default"))
def expand(x, size, implicit=False):
    old = [sympify(s) for s in x.get_size()]
    drop = len(size) - len(old)
    new = []
    for k, s in enumerate(size):
        if k < drop:
            new.append(sympify(s))
        elif isinstance(s, int) and s == -1:
            new.append(old[k - drop])
        else:
            new.append(sympify(s))
    if new == old:
        return x

    def stride_fn(sz, st, off):
        out = []
        for k, s in enumerate(new):
            if k < drop:
                out.append(S0)
            elif sz[k - drop] == 1 and s != 1:
                out.append(S0)
            else:
                out.append(st[k - drop])
        return out, off

    def reindex(index):
        out = []
        for k in range(len(old)):
            i = index[k + drop]
            out.append(S0 if old[k] == 1 else i)
        return out

    return _view(x, new, stride_fn, reindex)


# ---- squeeze / unsqueeze ------------------------------------------------------------------------


@lowering(*aten_ops("squeeze.default", "squeeze.dim", "squeeze.dims", "squeeze_copy.default",
                "squeeze_copy.dim", "squeeze_copy.dims"))
def squeeze(x, dim=None):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    if dim is None:
        dims = [k for k in range(n) if size[k] == 1]
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        dims = [_norm_dim(d, n) for d in dims]
        dims = [d for d in dims if n > 0 and size[d] == 1]
    keep = [k for k in range(n) if k not in dims]
    new = [size[k] for k in keep]

    def stride_fn(sz, st, off):
        return [st[k] for k in keep], off

    def reindex(index):
        out = [S0] * n
        for j, k in enumerate(keep):
            out[k] = index[j]
        return out

    return _view(x, new, stride_fn, reindex)


@lowering(*aten_ops("unsqueeze.default", "unsqueeze_copy.default"))
def unsqueeze(x, dim):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    d = dim + n + 1 if dim < 0 else dim
    new = size[:d] + [S1] + size[d:]

    def stride_fn(sz, st, off):
        # a size-1 dim: any stride works; use the torch convention (stride of the next dim * size)
        s = st[d] * sz[d] if d < n else S1
        return st[:d] + [s] + st[d:], off

    def reindex(index):
        return list(index[:d]) + list(index[d + 1:])

    return _view(x, new, stride_fn, reindex)


# ---- slice / select / narrow ---------------------------------------------------------------------


def _clamp_index(v, size, default):
    if v is None:
        return default
    v = sympify(v)
    if v.is_Integer:
        iv = int(v)
        if iv < 0:
            return sympy.Max(size + iv, S0) if not sympify(size).is_Integer else sympify(max(int(size) + iv, 0))
        if sympify(size).is_Integer:
            return sympify(min(iv, int(size)))
        if iv >= 2 ** 62:
            return sympify(size)
        return sympy.Min(v, size)
    return v


@lowering(*aten_ops("slice.Tensor", "slice_copy.Tensor"))
def slice_(x, dim=0, start=None, end=None, step=1):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    dim = _norm_dim(dim, n)
    start_ = _clamp_index(start, size[dim], S0)
    end_ = _clamp_index(end, size[dim], size[dim])
    msize = _meta_size()
    if msize is not None:
        length = msize[dim]
    else:
        length = sympy.Max(FloorDiv(end_ - start_ + step - 1, step), S0)
    if isinstance(start_, sympy.Min):
        # start beyond the end only matters when the result is empty
        start_ = start_.args[0] if length != 0 else start_
    step = sympify(step)
    new = list(size)
    new[dim] = length
    if new == size and start_ == 0:
        return x

    def stride_fn(sz, st, off):
        st2 = list(st)
        st2[dim] = st[dim] * step
        return st2, off + start_ * st[dim]

    def reindex(index):
        idx = list(index)
        idx[dim] = start_ + idx[dim] * step
        return idx

    return _view(x, new, stride_fn, reindex)


@lowering(*aten_ops("narrow.default"))
def narrow(x, dim, start, length):
    return slice_(x, dim, start, sympify(start) + length, 1)


@lowering(*aten_ops("unfold.default", "unfold_copy.default"))
def unfold(x, dim, size, step):
    """Windows of ``size`` every ``step`` along ``dim``, as a new last dim: out[..., i, ..., j]
    is x[..., i * step + j, ...] (a strided view, as eager's)."""
    shape = [sympify(s) for s in x.get_size()]
    if not shape:  # a 0-d tensor: one window of its one element
        return _view(x, [sympify(size)], lambda sz, st, off: ([S1], off), lambda idx: [])
    dim = _norm_dim(dim, len(shape))
    msize = _meta_size()
    windows = msize[dim] if msize is not None else FloorDiv(shape[dim] - size, step) + 1
    new = shape[:dim] + [windows] + shape[dim + 1:] + [sympify(size)]

    def stride_fn(sz, st, off):
        st2 = list(st)
        st2[dim] = st[dim] * step
        return st2 + [st[dim]], off

    def reindex(index):
        idx = list(index[:-1])
        idx[dim] = idx[dim] * step + index[-1]
        return idx

    return _view(x, new, stride_fn, reindex)


@lowering(*aten_ops("select.int", "select_copy.int"))
def select(x, dim, index):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    dim = _norm_dim(dim, n)
    index = sympify(index)
    if index.is_Integer and int(index) < 0:
        index = size[dim] + index
    new = size[:dim] + size[dim + 1:]

    def stride_fn(sz, st, off):
        return st[:dim] + st[dim + 1:], off + index * st[dim]

    def reindex(idx):
        idx = list(idx)
        return idx[:dim] + [index] + idx[dim:]

    return _view(x, new, stride_fn, reindex)


@lowering(*aten_ops("split_with_sizes.default", "split_with_sizes_copy.default"))
def split_with_sizes(x, split_sizes, dim=0):
    out = []
    start = S0
    for s in split_sizes:
        out.append(slice_(x, dim, start, start + sympify(s), 1) if True else None)
        start = start + sympify(s)
    return out


@lowering(*aten_ops("split.Tensor", "split_copy.Tensor"))
def split(x, split_size, dim=0):
    m = meta_val()
    g = current()
    sizes = [g.expr(t.shape[_norm_dim(dim, len(x.get_size()))]) for t in m]
    return split_with_sizes(x, sizes, dim)


@lowering(*aten_ops("unbind.int", "unbind_copy.int"))
def unbind(x, dim=0):
    n = len(x.get_size())
    dim = _norm_dim(dim, n)
    size = sympify(x.get_size()[dim])
    if not size.is_Integer:
        raise LoweringError("unbind over a symbolic size")
    return [select(x, dim, k) for k in range(int(size))]


# ---- diagonal ---------------------------------------------------------------------------------------


@lowering(*aten_ops("diagonal.default", "diagonal_copy.default"))
def diagonal(x, offset=0, dim1=0, dim2=1):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    d1, d2 = _norm_dim(dim1, n), _norm_dim(dim2, n)
    msize = _meta_size()
    if msize is None:
        raise LoweringError("diagonal needs meta")
    length = msize[-1]
    keep = [k for k in range(n) if k not in (d1, d2)]
    new = [size[k] for k in keep] + [length]
    off1 = max(-offset, 0)
    off2 = max(offset, 0)

    def stride_fn(sz, st, off):
        return [st[k] for k in keep] + [st[d1] + st[d2]], off + off1 * st[d1] + off2 * st[d2]

    def reindex(index):
        out = [S0] * n
        for j, k in enumerate(keep):
            out[k] = index[j]
        out[d1] = index[-1] + off1
        out[d2] = index[-1] + off2
        return out

    return _view(x, new, stride_fn, reindex)


# ---- view / reshape --------------------------------------------------------------------------------


def view_strides(old_size, old_stride, new_size):
    """Strides of ``new_size`` viewing a tensor of ``old_size``/``old_stride`` without a copy
    (torch's computeStride, symbolic); None when a copy would be needed."""
    old_size = [sympify(s) for s in old_size]
    old_stride = [sympify(s) for s in old_stride]
    new_size = [sympify(s) for s in new_size]
    if not old_size:
        return [S1] * len(new_size)
    new_stride = [S0] * len(new_size)
    view_d = len(new_size) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel = S1
    view_numel = S1
    for tensor_d in range(len(old_size) - 1, -1, -1):
        tensor_numel = tensor_numel * old_size[tensor_d]
        if tensor_d == 0 or (old_size[tensor_d - 1] != 1 and not statically_known_equal(
                old_stride[tensor_d - 1], tensor_numel * chunk_base_stride)):
            while view_d >= 0 and (not statically_known_equal(view_numel, tensor_numel) or new_size[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * new_size[view_d]
                view_d -= 1
                if view_d >= -1 and _known_gt(view_numel, tensor_numel):
                    return None
            if not statically_known_equal(view_numel, tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel = S1
                view_numel = S1
    if view_d != -1:
        return None
    return [sympy.expand(s) for s in new_stride]


def _known_gt(a, b) -> bool:
    d = sympy.simplify(sympify(a) - sympify(b))
    return bool(d.is_positive)


def _group_dims(old, new):
    """Pair runs of dims with equal products: [(old dims, new dims), ...]; None if it fails."""
    groups = []
    i = j = 0
    while i < len(old) or j < len(new):
        if i < len(old) and old[i] == 1 and (j >= len(new) or new[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(new) and new[j] == 1 and (i >= len(old) or old[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(old) or j >= len(new):
            return None
        gi, gj = [i], [j]
        po, pn = old[i], new[j]
        i += 1
        j += 1
        for _ in range(64):
            if statically_known_equal(po, pn):
                break
            if _known_gt(pn, po) or _divides(po, pn):
                if i >= len(old):
                    return None
                gi.append(i)
                po = po * old[i]
                i += 1
            else:
                if j >= len(new):
                    return None
                gj.append(j)
                pn = pn * new[j]
                j += 1
        else:
            return None
        groups.append((gi, gj))
    return groups


def _divides(a, b) -> bool:
    """a properly divides b (b/a is an integer expression other than 1)."""
    q = sympy.cancel(sympify(b) / sympify(a))
    n, d = sympy.fraction(q)
    return d == 1 and q != 1


def reshape_reindex(old_size, new_size):
    """``fn(new_index) -> old_index`` for a row-major reshape."""
    old = [sympify(s) for s in old_size]
    new = [sympify(s) for s in new_size]
    groups = _group_dims(old, new)
    if groups is None:
        groups = [(list(range(len(old))), list(range(len(new))))]

    def reindex(index):
        out = [S0] * len(old)
        for gi, gj in groups:
            if not gi:
                continue
            if len(gi) == 1 and len(gj) == 1:
                out[gi[0]] = index[gj[0]]
                continue
            nst = contiguous_strides([new[j] for j in gj])
            flat = sympy.Add(*[index[j] * s for j, s in zip(gj, nst, strict=False) if new[j] != 1]) if gj else S0
            ost = contiguous_strides([old[i] for i in gi])
            for k, (i, st) in enumerate(zip(gi, ost, strict=False)):
                if old[i] == 1:
                    out[i] = S0
                elif k == 0:
                    out[i] = FloorDiv(flat, st)
                else:
                    out[i] = ModularIndexing(flat, st, old[i])
        return out

    return reindex


def _new_size(x, size):
    """The view's size from its arguments (simpler than torch's meta sizes), -1 inferred."""
    size = [sympify(s) for s in size]
    if any(s == -1 for s in size):
        known = sympy.Mul(*[s for s in size if s != -1])
        total = sympy.Mul(*[sympify(s) for s in x.get_size()])
        q = sympy.cancel(total / known)
        n, d = sympy.fraction(q)
        inferred = q if d == 1 else FloorDiv(total, known)
        size = [inferred if s == -1 else s for s in size]
    return size


@lowering(*aten_ops("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
                "_reshape_alias.default"))
def view(x, size, *rest):
    new = _new_size(x, size)
    old = [sympify(s) for s in x.get_size()]
    if new == old:
        return x

    def stride_fn(sz, st, off):
        s = view_strides(sz, st, new)
        return None if s is None else (s, off)

    return _view(x, new, stride_fn, reshape_reindex(old, new))


@lowering(*aten_ops("as_strided.default", "as_strided_copy.default"))
def as_strided(x, size, stride, storage_offset=None):
    """A view of x's storage. Its size/stride are eager's, so x's storage must be laid out as
    eager's: a dense x with another layout here (realized contiguous where eager kept it
    permuted, channels-last) is first copied into eager's strides."""
    g = current()
    arg = g.current_node.args[0] if g.current_node is not None else None
    m = g._meta(arg) if isinstance(arg, torch.fx.Node) else None
    sv = as_storage_view(x)
    if sv is None:
        sv = as_storage_view(realize(x, _eager_dense_stride(g, m, x)))
    elif isinstance(m, torch.Tensor) and not has_eager_strides(g, sv.layout, m):
        eager = _eager_dense_stride(g, m, x)
        if eager is None:
            raise LoweringError(f"as_strided of a non-dense view laid out {sv.layout}, not as eager")
        sv = as_storage_view(realize(Pointwise(x.get_device(), x.get_dtype(), x.get_size(), sv.make_loader()),
                                     eager))
    lay = sv.layout
    if storage_offset is None:
        off = lay.offset
    else:
        # storage_offset is absolute in eager's storage; our offsets count from the buffer's
        # data pointer, which sits at eager offset (meta offset of x) - (our offset of x)
        eager_x = g.expr(m.storage_offset()) if isinstance(m, torch.Tensor) else lay.offset
        off = sympify(storage_offset) - (eager_x - lay.offset)
    return ReinterpretView(sv.data, Layout(lay.device, lay.dtype, [sympify(s) for s in size],
                                           [sympify(s) for s in stride], off))


def _eager_dense_stride(g, m, x):
    """eager's strides of x when they are a dense layout (None otherwise)."""
    if not isinstance(m, torch.Tensor) or m.dim() != len(x.get_size()):
        return None
    stride = [g.expr(st) for st in m.stride()]
    return stride if is_dense(x.get_size(), stride) else None


# ---- flip / repeat / roll ------------------------------------------------------------------------


@lowering(*aten_ops("flip.default"))
def flip(x, dims):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    dims = {_norm_dim(d, n) for d in dims}

    def reindex(index):
        return [size[k] - 1 - index[k] if k in dims else index[k] for k in range(n)]

    return GenericView(x, size, reindex)


@lowering(*aten_ops("repeat.default"))
def repeat(x, repeats):
    old = [sympify(s) for s in x.get_size()]
    drop = len(repeats) - len(old)
    new = [sympify(r) for r in repeats[:drop]] + [o * sympify(r) for o, r in zip(old, repeats[drop:], strict=False)]

    def reindex(index):
        out = []
        for k, o in enumerate(old):
            i = index[k + drop]
            r = sympify(repeats[k + drop])
            out.append(S0 if o == 1 else (i if r == 1 else ModularIndexing(i, 1, o)))
        return out

    return GenericView(x, new, reindex)


@lowering(*aten_ops("roll.default"))
def roll(x, shifts, dims=()):
    size = [sympify(s) for s in x.get_size()]
    n = len(size)
    if not dims:
        raise LoweringError("roll without dims")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    pairs = {_norm_dim(d, n): s for d, s in zip(dims, shifts, strict=False)}

    def reindex(index):
        out = list(index)
        for d, s in pairs.items():
            sz = size[d]
            sh = sympify(s) % sz if sz.is_Integer else sympify(s)
            out[d] = ModularIndexing(index[d] + sz - sh if not sz.is_Integer else index[d] + (int(sz) - int(sh)), 1, sz)
        return out

    return GenericView(x, size, reindex)
