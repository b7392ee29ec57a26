"""The values of kiln's loop IR: layouts, buffers, loop bodies and the views lowering passes
around (the first phase of ``kiln_loopir.ir``; the graph, schedule, printer and verifier
build on it).

Loop bodies are Python functions calling the virtualized ``ops`` (kiln_loopir.virtualized); no
views or broadcasts are left after lowering: only ``ops.load(name, index)`` with SymPy index
expressions over the storage of a buffer (``offset + sum(index_k * stride_k)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy
import torch

from ..sizevars import contiguous_strides, index_symbol, reduction_symbol, sexpr, sympify
from ..virtualized import ops


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype values of a ``dtype`` tensor have inside loop bodies: float16/bfloat16 are
    computed in float32, everything else as is."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _storage_loader(name: str, layout: Layout):
    indexer, dtype = layout.index, layout.dtype
    if dtype in (torch.float16, torch.bfloat16):
        def loader(index):
            return ops.to_dtype(ops.load(name, indexer(index)), torch.float32)
    else:
        def loader(index):
            return ops.load(name, indexer(index))
    return loader


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tuple_expr(xs) -> tuple[sympy.Expr, ...]:
    return tuple(sympify(x) for x in xs)


# ============================================================================================
# Layout
# ============================================================================================


@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements live: element ``index`` is at storage position
    ``offset + sum(index[k] * stride[k])`` (in elements)."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.Integer(0)

    def __post_init__(self):
        object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "size", _tuple_expr(self.size))
        object.__setattr__(self, "stride", _tuple_expr(self.stride))
        object.__setattr__(self, "offset", sympify(self.offset))
        if len(self.size) != len(self.stride):
            raise ValueError(f"size {self.size} and stride {self.stride} differ in length")

    @classmethod
    def contiguous(cls, device, dtype, size, offset=0) -> Layout:
        size = _tuple_expr(size)
        return cls(device, dtype, size, contiguous_strides(size), offset)

    @property
    def ndim(self) -> int:
        return len(self.size)

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.size) if self.size else sympy.Integer(1)

    def storage_size(self) -> sympy.Expr:
        """Elements of storage needed: ``offset + 1 + sum((size-1)*stride)`` (0 if empty)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((sz - 1) * st for sz, st in zip(self.size, self.stride, strict=False)),
                                     sympy.Integer(0))

    def is_contiguous(self) -> bool:
        want = contiguous_strides(self.size)
        return all(sz == 1 or sympy.simplify(st - w) == 0
                   for sz, st, w in zip(self.size, self.stride, want, strict=False))

    def index(self, index: Sequence) -> sympy.Expr:
        """Storage position of element ``index`` (dims of size 1 contribute nothing)."""
        if len(index) != len(self.size):
            raise ValueError(f"index {list(index)} has {len(index)} dims, layout has {self.ndim}")
        e = self.offset
        for i, sz, st in zip(index, self.size, self.stride, strict=False):
            if sz == 1 or st == 0:
                continue
            e = e + sympify(i) * st
        return e

    def make_indexer(self) -> Callable[[Sequence], sympy.Expr]:
        return self.index

    def with_(self, **kw) -> Layout:
        d = dict(device=self.device, dtype=self.dtype, size=self.size, stride=self.stride,
                 offset=self.offset)
        d.update(kw)
        return Layout(**d)

    def __str__(self) -> str:
        s = f"{dtype_str(self.dtype)}[{', '.join(sexpr(x) for x in self.size)}]"
        s += f" stride [{', '.join(sexpr(x) for x in self.stride)}]"
        if self.offset != 0:
            s += f" offset {sexpr(self.offset)}"
        return s


# ============================================================================================
# IR nodes used during lowering
# ============================================================================================


class IRNode:
    """Anything a lowering passes around: it has a size, a dtype, a device and a loader.

    ``make_loader()`` returns ``fn(index: list[Expr]) -> value`` (calls ``ops``). Lowerings call
    ``make_loader()`` while lowering (never inside a body) so realization decisions are fixed
    in lowering order.
    """

    def get_size(self) -> list[sympy.Expr]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Callable:
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        return self.get_dtype()

    @property
    def device(self) -> torch.device:
        return self.get_device()

    def get_numel(self) -> sympy.Expr:
        return sympy.Mul(*self.get_size()) if self.get_size() else sympy.Integer(1)


class _LaidOut(IRNode):
    """A node whose size, stride, dtype and device are its ``layout``'s."""

    layout: Layout

    def get_size(self):
        return list(self.layout.size)

    def get_stride(self):
        return list(self.layout.stride)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device


class Buffer(_LaidOut):
    """A named, allocated tensor with a ``Layout``."""

    def __init__(self, name: str, layout: Layout | None):
        self.name = name
        self.layout = layout

    def get_layout(self) -> Layout:
        return self.layout

    def make_loader(self):
        return _storage_loader(self.name, self.layout)

    def kind(self) -> str:
        return type(self).__name__

    def header(self) -> str:
        return f"{self.name}: {self.kind()} {self.layout}"

    def __repr__(self) -> str:
        return f"<{self.header()}>"


class InputBuffer(Buffer):
    """A graph input (tensor placeholder number ``position``)."""

    def __init__(self, name: str, layout: Layout, position: int):
        super().__init__(name, layout)
        self.position = position

    def header(self) -> str:
        return f"{self.name}: InputBuffer {self.layout}  # input {self.position}"


class ConstantBuffer(Buffer):
    """A tensor constant of the graph (``get_attr``); the wrapper binds ``name`` to ``value``.

    ``derived_from`` is set when ``value`` is a copy computed at compile time from another
    tensor (a weight stored channels-last): a later in-place write to that tensor is not seen
    by the copy, so whoever runs the graph must guard it (kiln recompiles). ``recipe``, for a
    constant made by a registered derivation (``kiln_loopir.derived_constants``), is
    ``(derivation, source constant's name, args)``: how to make it again."""

    def __init__(self, name: str, layout: Layout, value: torch.Tensor, target: str = "",
                 derived_from: torch.Tensor | None = None, recipe: tuple | None = None):
        super().__init__(name, layout)
        self.value = value
        self.target = target
        self.derived_from = derived_from
        self.recipe = recipe

    def comment(self) -> str:
        """``# constant <target>[, <derivation>(<source>, args)]`` for the text form."""
        text = f"  # constant {self.target}" if self.target else "  # constant"
        if self.recipe is not None:
            name, source, args = self.recipe
            text += f", {name}({', '.join([source, *map(str, args)])})"
        return text


class Loops:
    """Common part of ``Pointwise`` and ``Reduction``: the accessors of the Loops contract
    over ``device_``, ``dtype_`` and ``ranges``."""

    device_: torch.device
    dtype_: torch.dtype
    ranges: list[sympy.Expr]

    @property
    def device(self):
        return self.device_

    @property
    def dtype(self):
        return self.dtype_

    def get_size(self):
        return list(self.ranges)

    def get_dtype(self):
        return self.dtype_

    def get_device(self):
        return self.device_


class Pointwise(Loops, IRNode):
    """``out[index] = inner_fn(index)`` for ``index`` in ``ranges`` (row-major)."""

    def __init__(self, device, dtype, ranges, inner_fn: Callable):
        self.device_ = torch.device(device)
        self.dtype_ = dtype
        self.ranges = [sympify(r) for r in ranges]
        self.inner_fn = inner_fn
        self.realized: Buffer | None = None  # set when lowering realizes it into a buffer

    def make_loader(self):
        if self.realized is not None:
            return self.realized.make_loader()
        return self.inner_fn

    def __repr__(self) -> str:
        return f"Pointwise({dtype_str(self.dtype)}, ranges={[sexpr(r) for r in self.ranges]})"


class Reduction(Loops, IRNode):
    """``out[index] = reduce_{rindex in reduction_ranges} inner_fn(index, rindex)``.

    ``dtype`` is the output (buffer) dtype, ``src_dtype`` the dtype of the values inner_fn
    returns (already the compute dtype: float32 for half inputs), ``acc_dtype`` the
    accumulator dtype passed to ``ops.reduction``.
    """

    def __init__(self, device, dtype, src_dtype, ranges, reduction_ranges, reduction_type: str,
                 inner_fn: Callable, acc_dtype: torch.dtype | None = None):
        self.device_ = torch.device(device)
        self.dtype_ = dtype
        self.src_dtype = src_dtype
        self.ranges = [sympify(r) for r in ranges]
        self.reduction_ranges = [sympify(r) for r in reduction_ranges]
        self.reduction_type = reduction_type
        self.inner_fn = inner_fn
        self.acc_dtype = acc_dtype if acc_dtype is not None else _default_acc(reduction_type, dtype, src_dtype)
        self.realized: Buffer | None = None

    def make_loader(self):
        if self.realized is None:
            raise RuntimeError("a Reduction must be realized before it is loaded")
        return self.realized.make_loader()

    def __repr__(self) -> str:
        return (f"Reduction({self.reduction_type}, {dtype_str(self.dtype)}, "
                f"ranges={[sexpr(r) for r in self.ranges]}, "
                f"reduction_ranges={[sexpr(r) for r in self.reduction_ranges]})")


def _default_acc(rtype, dtype, src_dtype):
    if rtype in ("argmax", "argmin"):
        return torch.int64
    if rtype in ("any", "all"):
        return torch.bool
    if rtype in ("max", "min"):
        return src_dtype
    if src_dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return src_dtype


class ComputedBuffer(Buffer):
    """A buffer written by a loop nest (``data``: Pointwise or Reduction)."""

    def __init__(self, name: str, layout: Layout, data: Pointwise | Reduction):
        super().__init__(name, layout)
        self.data = data

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def store_body(self) -> Callable:
        """``body(index[, rindex])`` that computes and stores this buffer's element(s)."""
        name, indexer, data = self.name, self.layout.index, self.data
        if isinstance(data, Reduction):
            def rbody(index, rindex):
                value = data.inner_fn(index, rindex)
                r = ops.reduction(data.acc_dtype, data.src_dtype, data.reduction_type, value)
                return ops.store_reduction(name, indexer(index), r)
            return rbody

        dtype = self.layout.dtype
        if compute_dtype(dtype) != dtype:
            def body(index):
                return ops.store(name, indexer(index), ops.to_dtype(data.inner_fn(index), dtype))
        else:
            def body(index):
                return ops.store(name, indexer(index), data.inner_fn(index))

        return body

    def header(self) -> str:
        return f"{self.name}: ComputedBuffer {self.layout}"


class ScatterBuffer(ComputedBuffer):
    """A loop that writes into ANOTHER buffer (``target``, a ComputedBuffer already filled):
    scatter / scatter_add / index_put. For each ``index`` in ``data.ranges`` it stores
    ``data.inner_fn(index)`` at ``target.layout.index(output_indexer(index))`` with store
    ``mode`` (None: overwrite; "atomic_add": accumulate). ``output_indexer`` may call
    ``ops.indirect_indexing``. The ScatterBuffer's own name is only a step name: it is never
    allocated; readers of the result read ``target`` (after this node)."""

    def __init__(self, name: str, target: ComputedBuffer, data: Pointwise,
                 output_indexer: Callable, mode: str | None):
        super().__init__(name, target.layout, data)
        self.target = target
        self.output_indexer = output_indexer
        self.mode = mode

    @property
    def mutated_name(self) -> str:
        return self.target.name

    def store_body(self) -> Callable:
        tname, indexer, data = self.target.name, self.target.layout.index, self.data
        out_idx, mode, dtype = self.output_indexer, self.mode, self.target.layout.dtype

        def body(index):
            value = data.inner_fn(index)
            if compute_dtype(dtype) != dtype:
                value = ops.to_dtype(value, dtype)
            return ops.store(tname, indexer(out_idx(index)), value, mode)

        return body

    def header(self) -> str:
        m = f" ({self.mode})" if self.mode else ""
        return f"{self.name}: ScatterBuffer into {self.target.name}{m}"


class ExternKernel(Buffer):
    """A call of an aten op (``op``: an OpOverload) on ``inputs``/``kwargs``.

    ``inputs``/``kwargs`` values are Buffers, ``ReinterpretView``s (strided views of buffers:
    the wrapper passes ``torch.as_strided(buf, size, stride, offset)``), Python constants
    (int/float/bool/None/str/torch.dtype/torch.device/torch.layout/torch.memory_format), SymPy
    integer exprs over size symbols, or (nested) lists/tuples of these.
    ``layout`` is the layout of the result when the op returns ONE tensor; when it returns
    several, ``layout`` is None and ``outputs`` lists a ``MultiOutput`` per used result.
    ``fallback`` is True when this is the generic fallback for an op without a lowering.
    """

    def __init__(self, name: str, layout: Layout | None, op, inputs: list, kwargs: dict,
                 fallback: bool = False):
        super().__init__(name, layout)
        self.op = op
        self.inputs = list(inputs)
        self.kwargs = dict(kwargs)
        self.outputs: list[MultiOutput] = []
        self.fallback = fallback

    def input_buffers(self) -> list[str]:
        """Names of the buffers this call reads (in order, unique)."""
        out: list[str] = []

        def visit(x):
            if isinstance(x, ReinterpretView):
                x = x.data
            if isinstance(x, Buffer):
                if x.name not in out:
                    out.append(x.name)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    visit(y)
            elif isinstance(x, dict):
                for y in x.values():
                    visit(y)

        visit(self.inputs)
        visit(self.kwargs)
        return out

    def header(self) -> str:
        what = str(self.layout) if self.layout is not None else "multiple outputs"
        kind = "ExternKernel(fallback)" if self.fallback else "ExternKernel"
        return f"{self.name}: {kind} {what}"


class MultiOutput(Buffer):
    """Result number ``index`` of a multi-output ``ExternKernel`` (``source``)."""

    def __init__(self, name: str, layout: Layout, source: ExternKernel, index: int):
        super().__init__(name, layout)
        self.source = source
        self.index = index

    def header(self) -> str:
        return f"{self.name}: MultiOutput {self.layout} = {self.source.name}[{self.index}]"


class ReinterpretView(_LaidOut):
    """A strided view of a buffer's storage: element ``index`` at ``layout.index(index)``
    (the layout's offset/strides are in elements of ``data``'s storage)."""

    def __init__(self, data: Buffer, layout: Layout):
        self.data = data
        self.layout = layout

    @property
    def name(self) -> str:
        return self.data.name

    def make_loader(self):
        return _storage_loader(self.data.name, self.layout)

    def is_whole(self) -> bool:
        """True when this view is exactly its buffer (same size, stride, offset)."""
        dl = self.data.layout
        return dl is not None and (self.layout.size == dl.size and self.layout.stride == dl.stride
                                   and self.layout.offset == dl.offset)

    def __repr__(self) -> str:
        return f"ReinterpretView({self.data.name}, {self.layout})"


class GenericView(IRNode):
    """A view that is not strided: ``self[index] = data[reindex(index)]`` (loads only)."""

    def __init__(self, data: IRNode, size, reindex: Callable, dtype=None):
        self.data = data
        self.size = [sympify(s) for s in size]
        self.reindex = reindex
        self._dtype = dtype

    def get_size(self):
        return list(self.size)

    def get_dtype(self):
        return self._dtype or self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        inner = self.data.make_loader()
        reindex = self.reindex

        def loader(index):
            return inner(reindex(index))

        return loader

    def realize_via_base(self, stride=None) -> ReinterpretView | None:
        """What realizing this view gives instead of a copy (a view of its base's buffer), or
        None: a copy. Views of loops say otherwise (``lowerings.views.ViewOfLoop``)."""
        return None

    def broadcast_via_base(self) -> ReinterpretView | None:
        """A stride-0 view of the base's buffer for an extern's input, or None: a copy
        (``lowerings.views.ViewOfLoop``)."""
        return None

    def __repr__(self) -> str:
        return f"GenericView({self.data!r}, size={[sexpr(s) for s in self.size]})"


def body_indices(buf: ComputedBuffer) -> tuple[tuple[list[sympy.Symbol], ...], dict]:
    """The index lists a ComputedBuffer's ``store_body()`` is called with over its own
    symbols (i*, and r* for a Reduction), and the ranges of those symbols."""
    d = buf.data
    lists, ranges = [[index_symbol(k) for k in range(len(d.ranges))]], [d.ranges]
    if isinstance(d, Reduction):
        lists.append([reduction_symbol(k) for k in range(len(d.reduction_ranges))])
        ranges.append(d.reduction_ranges)
    var_ranges = {s: r for syms, rs in zip(lists, ranges, strict=True)
                  for s, r in zip(syms, rs, strict=True)}
    return tuple(lists), var_ranges

