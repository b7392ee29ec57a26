"""kiln's define-by-run loop IR: layouts, buffers, loop bodies, the graph and the schedule.

A ``LoopGraph`` is what ``lower`` produces from an ATen FX graph:

* ``inputs``: ``InputBuffer`` per tensor placeholder (``position`` = placeholder position);
* ``buffers``: in topological order, each a ``ComputedBuffer`` (a ``Pointwise`` or
  ``Reduction`` loop nest writing one buffer) or an ``ExternKernel`` (an aten op called as is:
  matmul, conv, ..., and the fallback for ops without a lowering; a multi-output extern has
  ``MultiOutput`` buffers selecting its results);
* ``outputs``: per graph output a ``ReinterpretView`` (buffer name + size/stride/offset) or a
  Python scalar;
* ``sizevars``: ``{s-symbol: SizeVarSource}`` (read ``inputs[pos].size(dim)`` at run time);
* ``constants``: ``{name: tensor}`` for ``ConstantBuffer``s (get_attr tensors).

Loop bodies are Python functions calling the virtualized ``ops`` (kiln_loopir.virtualized); no
views or broadcasts are left after lowering: only ``ops.load(name, index)`` with SymPy index
expressions over the storage of a buffer (``offset + sum(index_k * stride_k)``).

``print(graph)`` gives the text form documented in docs/ir.md.

A ``Schedule`` (kiln_loopir.scheduler.schedule) orders ``FusedGroup``s and ``ExternNode``s and
carries the memory plan (``Allocation``s per step, frees after each step).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .analysis import MemoryDep, body_deps
from .ops_spec import OPS
from .sizevars import (
    SizeVarSource,
    contiguous_strides,
    free_size_symbols,
    index_symbol,
    reduction_symbol,
    sexpr,
    simplify_index,
    sympify,
)
from .virtualized import ops, set_ops_handler

__all__ = [
    "Layout",
    "IRNode",
    "Buffer",
    "InputBuffer",
    "ConstantBuffer",
    "ComputedBuffer",
    "ExternKernel",
    "ScatterBuffer",
    "MultiOutput",
    "ReinterpretView",
    "GenericView",
    "Loops",
    "Pointwise",
    "Reduction",
    "LoopGraph",
    "MemoryDep",
    "collect_deps",
    "SchedNode",
    "FusedGroup",
    "ExternNode",
    "Allocation",
    "Schedule",
    "PrintHandler",
    "dtype_str",
    "compute_dtype",
    "body_text",
]


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

    def call_text(self) -> str:
        args = [_arg_text(a) for a in self.inputs]
        args += [f"{k}={_arg_text(v)}" for k, v in self.kwargs.items()]
        return f"{_op_text(self.op)}({', '.join(args)})"


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


def _op_text(op) -> str:
    name = getattr(op, "_name", None) or getattr(op, "__name__", str(op))
    if name.startswith("aten::"):
        name = name[len("aten::"):]
        ov = getattr(op, "_overloadname", "default")
        base = name.split(".")[0]
        return f"aten.{base}.{ov}"
    return str(name)


def _arg_text(a) -> str:
    if isinstance(a, ReinterpretView):
        if a.is_whole():
            return a.data.name
        return (f"as_strided({a.data.name}, [{', '.join(sexpr(s) for s in a.layout.size)}], "
                f"[{', '.join(sexpr(s) for s in a.layout.stride)}], {sexpr(a.layout.offset)})")
    if isinstance(a, Buffer):
        return a.name
    if isinstance(a, sympy.Basic):
        return sexpr(a)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_text(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return str(a)
    return repr(a)


# ============================================================================================
# printing bodies
# ============================================================================================


class PrintHandler:
    """An ops handler that records each op as a line ``tmpN = ops.name(args)``."""

    def __init__(self, var_ranges: dict | None = None, simplify: bool = True):
        self.lines: list[str] = []
        self._n = 0
        self._ind = 0
        self.var_ranges = var_ranges or {}
        self.simplify = simplify

    def _arg(self, a) -> str:
        if isinstance(a, _Val):
            return a.name
        if isinstance(a, sympy.Basic):
            if self.simplify:
                a = simplify_index(a, self.var_ranges)
            return sexpr(a)
        if isinstance(a, torch.dtype):
            return dtype_str(a)
        if isinstance(a, str):
            return a
        return repr(a)

    def _emit(self, name, args, kwargs=None, returns=True):
        parts = [self._arg(a) for a in args]
        for k, v in (kwargs or {}).items():
            if v is not None:
                parts.append(f"{k}={self._arg(v)}")
        call = f"ops.{name}({', '.join(parts)})"
        if not returns:
            self.lines.append(call)
            return None
        v = _Val(f"tmp{self._n}")
        self._n += 1
        self.lines.append(f"{v.name} = {call}")
        return v

    def indirect_indexing(self, x, size, check=True):
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        self.lines.append(f"{sym.name} = ops.indirect_indexing({self._arg(x)}, {self._arg(size)})")
        return sym

    def store(self, name, index, value, mode=None):
        return self._emit("store", (name, index, value), {"mode": mode}, returns=False)

    def store_reduction(self, name, index, value):
        return self._emit("store_reduction", (name, index, value), returns=False)

    def __getattr__(self, name):
        if name not in OPS:
            raise AttributeError(name)

        def op(*args, **kwargs):
            return self._emit(name, args, kwargs)

        return op


class _Val:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


def body_text(fn: Callable, *index_lists, var_ranges: dict | None = None) -> list[str]:
    """Run ``fn(*index_lists)`` under a ``PrintHandler``; return its lines."""
    h = PrintHandler(var_ranges)
    with set_ops_handler(h):
        fn(*index_lists)
    return h.lines


def _return_text(outputs) -> str:
    """The text form's last line: the graph's outputs (a whole-buffer view by its name)."""
    outs = [o.data.name if isinstance(o, ReinterpretView) and o.is_whole() else _arg_text(o)
            for o in outputs]
    return f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})"


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


def _buffer_text(buf: Buffer, indent: str = "  ") -> list[str]:
    lines = [buf.header()]
    if isinstance(buf, ComputedBuffer):
        d = buf.data
        if isinstance(d, Reduction):
            lines.append(f"{indent}Reduction {d.reduction_type} ranges "
                         f"[{', '.join(sexpr(r) for r in d.ranges)}] reduction_ranges "
                         f"[{', '.join(sexpr(r) for r in d.reduction_ranges)}]")
        else:
            lines.append(f"{indent}Pointwise ranges [{', '.join(sexpr(r) for r in d.ranges)}]")
        index_lists, var_ranges = body_indices(buf)
        lines += [indent * 2 + b
                  for b in body_text(buf.store_body(), *index_lists, var_ranges=var_ranges)]
    elif isinstance(buf, ExternKernel):
        lines.append(f"{indent}{buf.call_text()}")
    elif isinstance(buf, ConstantBuffer):
        lines[0] += buf.comment()
    return lines


# ============================================================================================
# LoopGraph
# ============================================================================================


class LoopGraph:
    """The lowered graph (see the module docstring)."""

    def __init__(self, device: torch.device | None = None):
        self.inputs: list[InputBuffer] = []
        self.input_positions: list[int | None] = []  # placeholder position -> index in inputs
        self.num_placeholders = 0
        self.buffers: list[Buffer] = []
        self.outputs: list[Any] = []
        self.sizevars: dict[sympy.Symbol, SizeVarSource] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.constant_buffers: list[ConstantBuffer] = []
        self.guards: list[sympy.Basic] = []
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.name_to_buffer: dict[str, Buffer] = {}
        self._counter = itertools.count()
        self.size_hints: dict[sympy.Symbol, int] = {}  # example value of each size symbol
        self.meta: dict[str, Any] = {}

    # ---- building --------------------------------------------------------------------------
    def new_name(self) -> str:
        return f"buf{next(self._counter)}"

    def add_input(self, buf: InputBuffer) -> InputBuffer:
        self.inputs.append(buf)
        self.name_to_buffer[buf.name] = buf
        return buf

    def add_constant(self, buf: ConstantBuffer) -> ConstantBuffer:
        self.constant_buffers.append(buf)
        self.constants[buf.name] = buf.value
        self.name_to_buffer[buf.name] = buf
        return buf

    def register_buffer(self, buf: Buffer) -> Buffer:
        if buf.name in self.name_to_buffer:
            raise ValueError(f"duplicate buffer name {buf.name}")
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf
        return buf

    # ---- reading ---------------------------------------------------------------------------
    def get_buffer(self, name: str) -> Buffer:
        return self.name_to_buffer[name]

    def output_names(self) -> list[str]:
        return [o.data.name for o in self.outputs if isinstance(o, ReinterpretView)]

    def size_symbols(self) -> list[sympy.Symbol]:
        return sorted(self.sizevars, key=lambda s: int(s.name[1:]))

    def __str__(self) -> str:
        lines = [f"LoopGraph device={self.device}"]
        if self.sizevars:
            lines.append("sizevars: " + ", ".join(
                f"{s}={src!r}" for s, src in sorted(self.sizevars.items(), key=lambda kv: kv[0].name)))
        for b in self.inputs:
            lines.append(b.header())
        for b in self.constant_buffers:
            lines += _buffer_text(b)
        for b in self.buffers:
            lines += _buffer_text(b)
        lines.append(_return_text(self.outputs))
        return "\n".join(lines)

    __repr__ = __str__

    def lint(self) -> None:
        """Check the graph: names unique, loads/stores name known buffers defined earlier."""
        seen = {b.name for b in self.inputs} | set(self.constants)
        for b in self.buffers:
            if isinstance(b, ComputedBuffer):
                reads, writes = collect_deps(b)
                for d in reads:
                    if d.name not in seen:
                        raise AssertionError(f"{b.name} reads {d.name} before it is defined")
                own = b.target.name if isinstance(b, ScatterBuffer) else b.name
                for d in writes:
                    if d.name != own:
                        raise AssertionError(f"{b.name} writes {d.name}")
            elif isinstance(b, ExternKernel):
                for n in b.input_buffers():
                    if n not in seen:
                        raise AssertionError(f"{b.name} reads {n} before it is defined")
            elif isinstance(b, MultiOutput):
                if b.source.name not in seen:
                    raise AssertionError(f"{b.name} selects from undefined {b.source.name}")
            seen.add(b.name)
        for o in self.outputs:
            if isinstance(o, ReinterpretView) and o.data.name not in seen:
                raise AssertionError(f"output reads undefined {o.data.name}")


def collect_deps(buf: ComputedBuffer) -> tuple[list[MemoryDep], list[MemoryDep]]:
    """(reads, writes) of a ComputedBuffer over its own symbols i*/r*."""
    index_lists, var_ranges = body_indices(buf)
    h = body_deps(buf.store_body(), *index_lists, var_ranges=var_ranges)
    return h.reads, h.writes


# ============================================================================================
# Schedule
# ============================================================================================


@dataclass
class SchedNode:
    """One ComputedBuffer inside a FusedGroup.

    ``body(outer_index, inner_index)`` calls ``ops``: loads, compute and ``ops.store`` (for a
    pointwise node, once per (outer, inner) point) or ``ops.reduction`` + ``ops.store_reduction``
    (a reduction node: the value is reduced over the inner ranges; the store happens once per
    outer point, after the inner loop).
    """

    buffer: ComputedBuffer
    kind: str  # "pointwise" | "reduction"
    inner: list[sympy.Expr]
    body: Callable[[list, list], Any]
    reads: list[MemoryDep] = field(default_factory=list)
    writes: list[MemoryDep] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def reduction_type(self) -> str | None:
        d = self.buffer.data
        return d.reduction_type if isinstance(d, Reduction) else None

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.layout.dtype

    def text(self, outer_syms, indent="  ") -> list[str]:
        inner_syms = [reduction_symbol(k) for k in range(len(self.inner))]
        head = f"{self.buffer.name}: {self.kind}"
        if self.inner:
            head += f" inner [{', '.join(sexpr(r) for r in self.inner)}]"
        if self.kind == "reduction":
            head += f" {self.reduction_type}"
        lines = [head]
        lines += [indent + ln for ln in body_text(self.body, outer_syms, inner_syms)]
        return lines


@dataclass
class Allocation:
    """Memory plan entry: allocate buffer ``name`` with ``layout`` before its step, or take
    over the storage of the freed buffer ``reuses`` (same storage size, dtype and device).
    ``internal``: the buffer lives only inside one FusedGroup (see FusedGroup.internal_buffers).
    ``in_place``: ``reuses`` is read by this very step (its last use) and dies after it: the
    step writes each element over the one it reads (``scheduler.in_place_source``)."""

    name: str
    layout: Layout
    reuses: str | None = None
    internal: bool = False
    in_place: bool = False

    def __str__(self) -> str:
        r = f" reuses {self.reuses}" if self.reuses else ""
        r += " in place" if self.in_place else ""
        i = " internal" if self.internal else ""
        return f"alloc {self.name} {self.layout}{r}{i}"


class _ScheduleStep:
    """The text form shared by the schedule's steps: ``text()`` lines, the buffers freed
    after the step last."""

    frees: list[str]

    def _with_frees(self, lines: list[str], indent: str) -> list[str]:
        if self.frees:
            lines.append(indent + "free: " + ", ".join(self.frees))
        return lines

    def __str__(self) -> str:
        return "\n".join(self.text())


@dataclass
class FusedGroup(_ScheduleStep):
    """A loop nest over ``outer`` (parallel) running ``nodes`` in order per outer point."""

    name: str
    outer: list[sympy.Expr]
    nodes: list[SchedNode]
    device: torch.device = torch.device("cpu")
    reads: list[MemoryDep] = field(default_factory=list)  # reads of buffers from outside the group
    writes: list[MemoryDep] = field(default_factory=list)  # all stores
    internal_buffers: set[str] = field(default_factory=set)
    allocations: list[Allocation] = field(default_factory=list)
    frees: list[str] = field(default_factory=list)  # buffers dead after this step

    kind = "group"

    @property
    def outer_symbols(self) -> list[sympy.Symbol]:
        return [index_symbol(k) for k in range(len(self.outer))]

    def buffer_names(self) -> list[str]:
        return [n.buffer.name for n in self.nodes]

    def input_names(self) -> list[str]:
        """Buffers read from outside the group (order of first read)."""
        out: list[str] = []
        for d in self.reads:
            if d.name not in out:
                out.append(d.name)
        return out

    def output_names(self) -> list[str]:
        """Buffers written by the group that are needed outside it (for a ScatterBuffer node:
        the buffer it writes into)."""
        out = []
        for n in self.nodes:
            nm = getattr(n.buffer, "mutated_name", n.buffer.name)
            if nm not in self.internal_buffers and nm not in out:
                out.append(nm)
        return out

    def size_symbols(self) -> list[sympy.Symbol]:
        """Size symbols (``s*``) used by ranges and indices of this group, sorted."""
        exprs = list(self.outer)
        for n in self.nodes:
            exprs += list(n.inner)
            exprs += [d.index for d in n.reads] + [d.index for d in n.writes]
        return free_size_symbols(exprs)

    def is_reduction(self) -> bool:
        return any(n.kind == "reduction" for n in self.nodes)

    def text(self, indent="  ") -> list[str]:
        lines = [f"{self.name}: FusedGroup outer [{', '.join(sexpr(o) for o in self.outer)}]"]
        for a in self.allocations:
            lines.append(indent + str(a))
        for n in self.nodes:
            lines += [indent + ln for ln in n.text(self.outer_symbols, indent)]
        if self.internal_buffers:
            lines.append(indent + "internal: " + ", ".join(sorted(self.internal_buffers)))
        return self._with_frees(lines, indent)


@dataclass
class ExternNode(_ScheduleStep):
    """A step calling an ExternKernel (and binding its MultiOutputs)."""

    kernel: ExternKernel
    allocations: list[Allocation] = field(default_factory=list)  # always empty: aten allocates
    frees: list[str] = field(default_factory=list)

    kind = "extern"

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def outputs(self) -> list[MultiOutput]:
        return self.kernel.outputs

    @property
    def reads(self) -> list[str]:
        return self.kernel.input_buffers()

    @property
    def writes(self) -> list[str]:
        return [self.kernel.name] + [m.name for m in self.kernel.outputs]

    def text(self, indent="  ") -> list[str]:
        lines = _buffer_text(self.kernel, indent)
        for m in self.kernel.outputs:
            lines.append(indent + m.header())
        return self._with_frees(lines, indent)


@dataclass
class Schedule:
    """Ordered steps (FusedGroup | ExternNode) + memory plan, for one LoopGraph."""

    graph: LoopGraph
    steps: list[FusedGroup | ExternNode]

    @property
    def groups(self) -> list[FusedGroup]:
        return [s for s in self.steps if isinstance(s, FusedGroup)]

    @property
    def externs(self) -> list[ExternNode]:
        return [s for s in self.steps if isinstance(s, ExternNode)]

    @property
    def inputs(self) -> list[InputBuffer]:
        return self.graph.inputs

    @property
    def outputs(self) -> list:
        return self.graph.outputs

    @property
    def sizevars(self) -> dict:
        return self.graph.sizevars

    @property
    def device(self) -> torch.device:
        return self.graph.device

    def lint(self) -> None:
        """Check the schedule: every buffer is written before it is read (or earlier in the
        same group), allocations happen once and reuse only freed buffers, nothing is used
        after it is freed, inputs/constants/outputs are never freed."""
        g = self.graph
        keep = {b.name for b in g.inputs} | set(g.constants) | set(g.output_names())
        ready = {b.name for b in g.inputs} | set(g.constants)
        freed: set[str] = set()
        lent: set[str] = set()
        allocated: set[str] = set()
        for step in self.steps:
            for a in step.allocations:
                if a.name in allocated:
                    raise AssertionError(f"{a.name} allocated twice")
                if a.in_place:
                    if a.reuses in freed or a.reuses not in step.frees or a.reuses in keep:
                        raise AssertionError(f"{a.name} reuses {a.reuses} in place, which does not "
                                             f"die at {step.name}")
                elif a.reuses is not None and (a.reuses not in freed or a.reuses in lent):
                    raise AssertionError(f"{a.name} reuses {a.reuses}, which is not free")
                if a.reuses is not None:
                    freed.discard(a.reuses)
                    lent.add(a.reuses)
                allocated.add(a.name)
            if isinstance(step, FusedGroup):
                written: set[str] = set()
                for n in step.nodes:
                    for d in n.reads:
                        if d.name not in ready and d.name not in written:
                            raise AssertionError(f"{step.name}: {n.name} reads {d.name} before it is written")
                        if d.name in freed:
                            raise AssertionError(f"{step.name}: {n.name} reads freed {d.name}")
                    for d in n.writes:
                        if d.name in freed:
                            raise AssertionError(f"{step.name}: {n.name} writes freed {d.name}")
                        if d.name not in allocated and d.name not in ready:
                            raise AssertionError(f"{step.name}: {d.name} is written but never allocated")
                        written.add(d.name)
                ready |= written
            else:
                for nm in step.reads:
                    if nm not in ready:
                        raise AssertionError(f"{step.name} reads {nm} before it is written")
                    if nm in freed:
                        raise AssertionError(f"{step.name} reads freed {nm}")
                ready |= set(step.writes)
            for nm in step.frees:
                if nm in keep:
                    raise AssertionError(f"{nm} is an input, constant or output but is freed")
                freed.add(nm)

    def memory_plan(self) -> list[tuple[str, list[Allocation], list[str]]]:
        """Per step: (step name, allocations before it, buffers freed after it)."""
        return [(s.name, list(s.allocations), list(s.frees)) for s in self.steps]

    def __str__(self) -> str:
        lines = [f"Schedule device={self.graph.device}"]
        if self.graph.sizevars:
            lines.append("sizevars: " + ", ".join(
                f"{s}={src!r}" for s, src in sorted(self.graph.sizevars.items(), key=lambda kv: kv[0].name)))
        for b in self.graph.inputs:
            lines.append(b.header())
        for b in self.graph.constant_buffers:
            lines.append(b.header() + b.comment())
        for s in self.steps:
            lines += s.text()
        lines.append(_return_text(self.graph.outputs))
        return "\n".join(lines)

    __repr__ = __str__
