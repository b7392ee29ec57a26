"""ATen FX graph -> LoopGraph: the lowering registry and the graph walker.

    @lowering(aten.sin.default)
    def sin(x): ...            # receives IRNodes / Python values / SymPy exprs, returns an IRNode

``lower(aten_gm)`` walks the graph: placeholders become ``InputBuffer``s (``arg0, arg1, ...``),
``get_attr`` tensors ``ConstantBuffer``s, each ``call_function`` goes through its lowering, and
the output node realizes the outputs. Values flowing between lowerings are IRNodes: unrealized
``Pointwise`` loops (so pointwise producers inline into their consumers), views
(``ReinterpretView`` / ``GenericView``: index arithmetic), or buffers.

Realization policy (when a value gets its own buffer; everything else is inlined):
  1. graph outputs;
  2. every Reduction (a reduction is always its own ComputedBuffer);
  3. inputs of extern kernels (matmul, conv, the aten fallback, ...);
  4. a pointwise value used by more than one FX user whose body is "heavy": more than
     ``REALIZE_READS_THRESHOLD`` (4) loads or more than ``REALIZE_OPS_THRESHOLD`` (40) ops,
     or a ``COSTLY_OPS`` op (sin, exp, ...) while some user broadcasts it (rotary
     embeddings' cos/sin: computed once, not once per head and layer);
  5. any pointwise value whose body exceeds ``MAX_INLINE_OPS`` (200) ops (bounds code size).
Cheap producers used several times are recomputed in each consumer (the scheduler then fuses
consumers that share inputs). Extern inputs computed by loops are written in eager's layout
where that is dense with the last dim innermost (``_eager_input_strides``: SDPA then returns
eager's layout and the transpose after it stays a view), and several strided views of one
loop realize the loop once (``lowerings.views.ViewOfLoop``), not one copy per view.

One lowering per op (``@lowering`` refuses a second). The aten fallback, an ``ExternKernel``
calling the aten op (logged once per op, counted in ``counters["aten_fallbacks"]``), is taken
by ops declared with ``fallback(op, reason=...)`` (``lowerings/fallbacks.py``), by lowerings
that decline their arguments (``LoweringError``) and by nodes touching dtypes loop bodies do
not compute in. An op with neither a lowering nor a declaration raises ``MissingLowering``;
a lowering that raises anything else, or disagrees with the node's ``meta["val"]``
(dtype/size), raises ``LoweringBug``: both name the op.

An extern's result gets the layout the op returns for its inputs' real layouts
(``extern_result_meta``), which kernels reading it rely on.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .counters import counters
from .ir import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    GenericView,
    InputBuffer,
    IRNode,
    Layout,
    LoopGraph,
    MultiOutput,
    Pointwise,
    Reduction,
    ReinterpretView,
    compute_dtype,
)
from .sizevars import (
    SizeVarAllocator,
    SizeVarSource,
    contiguous_strides,
    index_symbol,
    statically_known_equal,
    sympify,
)
from .virtualized import ops

log = logging.getLogger("kiln.loopir")

aten = torch.ops.aten

__all__ = [
    "aten_ops",
    "lowering",
    "lowerings",
    "fallback",
    "fallbacks",
    "MissingLowering",
    "LoweringBug",
    "lower",
    "LoweringError",
    "GraphLowering",
    "current",
    "realize",
    "realize_input",
    "make_pointwise",
    "meta_val",
    "is_dense",
    "has_eager_strides",
    "to_dtype",
    "constant_value",
    "broadcast_to",
    "REALIZE_READS_THRESHOLD",
    "REALIZE_OPS_THRESHOLD",
    "MAX_INLINE_OPS",
]

REALIZE_READS_THRESHOLD = 4
REALIZE_OPS_THRESHOLD = 40
MAX_INLINE_OPS = 200
#: math ops worth tens of simple ones: a value computing one that several consumers broadcast
#: (rotary embeddings' cos/sin, read once per head in every layer) is computed once, not per
#: consumer element
COSTLY_OPS = frozenset({"sin", "cos", "tan", "exp", "exp2", "expm1", "log", "log2", "log10",
                        "log1p", "tanh", "erf", "erfc", "pow", "sigmoid", "atan", "atan2",
                        "asin", "acos", "sinh", "cosh"})

#: op -> lowering function
lowerings: dict[Any, Callable] = {}
#: op -> why it runs as a call of the aten op (declared with ``fallback(op, reason=...)``)
fallbacks: dict[Any, str] = {}


#: namespaces of torch's own operators: a missing lowering of one of theirs is loopir's gap
TORCH_NAMESPACES = frozenset({
    "aten", "prims", "rngprims", "quantized", "_quantized", "quantized_decomposed", "mkldnn",
    "onednn", "c10d", "_c10d_functional", "_c10d_functional_autograd", "profiler",
    "debugprims", "inductor",
})


def _library_op(target) -> bool:
    """An operator another library registered (``torch.library``: transformers'
    ``grouped_mm_fallback``, torchvision's ``nms``): loopir can never have a lowering for it,
    so it runs as an aten fallback (an extern call to its kernel) instead of failing the graph."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace not in TORCH_NAMESPACES


#: in-place view ops (they change a tensor's size/strides, not its values) -> the view op
#: computing the same view, for values the graph computed
METADATA_MUTATIONS = {
    getattr(getattr(aten, inplace), ov): getattr(getattr(aten, functional), ov)
    for inplace, functional, ov in [("as_strided_", "as_strided", "default"),
                                    ("unsqueeze_", "unsqueeze", "default"),
                                    ("squeeze_", "squeeze", "dim"),
                                    ("transpose_", "transpose", "int"),
                                    ("t_", "t", "default")]
    if hasattr(getattr(aten, inplace, None), ov) and hasattr(getattr(aten, functional, None), ov)
}


class LoweringError(NotImplementedError):
    """A lowering cannot handle these arguments (the node then takes the aten fallback)."""


class MissingLowering(LookupError):
    """An op with neither a lowering nor a declared aten fallback."""


class LoweringBug(RuntimeError):
    """A lowering raised something other than LoweringError, or returned a value that
    disagrees with the node's ``meta["val"]``: a bug in that lowering, named in the message."""


def aten_ops(*names: str) -> list:
    """``aten.<packet>.<overload>`` for each ``"packet.overload"`` name (``"packet"`` alone:
    ``.default``), leaving out the ones this torch lacks."""
    out = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
        if op is not None:
            out.append(op)
    return out


def _overloads(op) -> list:
    """An OpOverload, or every overload of an OpOverloadPacket (None: an op this torch lacks)."""
    if op is None:
        return []
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, ov) for ov in op.overloads()]
    return [op]


def _refuse_duplicate(op) -> None:
    if op in lowerings:
        fn = lowerings[op]
        raise ValueError(f"{_op_name(op)} already has a lowering "
                         f"({fn.__module__}.{fn.__qualname__}): one lowering per op")
    if op in fallbacks:
        raise ValueError(f"{_op_name(op)} is already declared an aten fallback ({fallbacks[op]})")


def lowering(*ops_: Any) -> Callable:
    """Register ``fn`` as the lowering of each op (an OpOverload, or an OpOverloadPacket: all
    its overloads). A second registration for an op raises."""

    def register(fn):
        for op in ops_:
            for ov in _overloads(op):
                _refuse_duplicate(ov)
                lowerings[ov] = fn
        return fn

    return register


def fallback(*ops_: Any, reason: str) -> None:
    """Declare that each op runs as a call of the aten op (an ``ExternKernel``, counted in
    ``counters["aten_fallbacks"]``) and why. An op with neither a lowering nor this
    declaration fails with MissingLowering."""
    if not reason:
        raise ValueError("an aten fallback needs a reason")
    for op in ops_:
        for ov in _overloads(op):
            _refuse_duplicate(ov)
            fallbacks[ov] = reason


# --------------------------------------------------------------------------------------------
# the current GraphLowering (lowerings reach the graph being built through ``current()``)
# --------------------------------------------------------------------------------------------

_current: list[GraphLowering] = []


def current() -> GraphLowering:
    if not _current:
        raise RuntimeError("no graph is being lowered")
    return _current[-1]


# --------------------------------------------------------------------------------------------
# realization
# --------------------------------------------------------------------------------------------


def _is_storage(x) -> bool:
    return isinstance(x, (Buffer, ReinterpretView))


def realize(x: IRNode, stride=None) -> Buffer | ReinterpretView:
    """Give ``x`` a buffer (if it has none): returns a Buffer or a ReinterpretView of one."""
    if isinstance(x, (Buffer, ReinterpretView)):
        return x
    if isinstance(x, (Pointwise, Reduction)):
        if x.realized is not None:
            return x.realized
        g = current()
        size = x.get_size()
        if stride is None:
            stride = contiguous_strides(size)
        layout = Layout(x.get_device(), x.get_dtype(), size, stride)
        buf = ComputedBuffer(g.graph.new_name(), layout, x)
        g.graph.register_buffer(buf)
        counters["buffers"] += 1
        x.realized = buf
        return buf
    if isinstance(x, GenericView):
        from .lowerings.views import ViewOfLoop

        if isinstance(x, ViewOfLoop) and (via := x.realize_via_base(stride)) is not None:
            return via
        loader = x.make_loader()
        return realize(Pointwise(x.get_device(), x.get_dtype(), x.get_size(), loader), stride)
    raise TypeError(f"cannot realize {x!r}")


def realize_input(x: IRNode, stride=None) -> Buffer | ReinterpretView:
    """For extern inputs: a buffer or a strided view of one (a fresh buffer gets ``stride``,
    default contiguous; a broadcast of a loop stays a stride-0 view of the loop's buffer)."""
    from .lowerings.views import ViewOfLoop

    if stride is None and isinstance(x, ViewOfLoop) and (via := x.broadcast_via_base()) is not None:
        return via
    r = realize(x, stride)
    if isinstance(r, ReinterpretView) and r.is_whole():
        return r.data
    return r


def as_storage_view(x: IRNode) -> ReinterpretView | None:
    """A ReinterpretView for storage-backed values (buffers, strided views), else None."""
    if isinstance(x, ReinterpretView):
        return x
    if isinstance(x, Buffer) and x.layout is not None:
        return ReinterpretView(x, x.layout)
    if isinstance(x, (Pointwise, Reduction)) and x.realized is not None:
        return as_storage_view(x.realized)
    return None


# --------------------------------------------------------------------------------------------
# value helpers used by lowerings
# --------------------------------------------------------------------------------------------


def to_dtype(value, src: torch.dtype, dst: torch.dtype):
    """Convert an ops value of logical dtype ``src`` to logical dtype ``dst`` (values of half
    dtypes are float32 in bodies: the cast rounds through the half type)."""
    if src == dst:
        return value
    cs, cd = compute_dtype(src), compute_dtype(dst)
    if dst in (torch.float16, torch.bfloat16):
        # round to the half type, then carry as float32
        return ops.to_dtype(ops.to_dtype(value, dst), torch.float32)
    if cs == cd:
        return value
    return ops.to_dtype(value, cd)


def constant_value(value, dtype: torch.dtype):
    """An ops value for a Python scalar / SymPy expr, in compute dtype of ``dtype``."""
    cd = compute_dtype(dtype)
    if isinstance(value, sympy.Basic):
        if value.is_Integer:
            value = int(value)
        elif value.is_Float or value.is_Rational:
            value = float(value)
        else:
            v = ops.index_expr(value, torch.int64)
            return v if cd == torch.int64 else ops.to_dtype(v, cd)
    if isinstance(value, torch.Tensor):
        value = value.item()
    if cd == torch.bool:
        value = bool(value)
    elif not cd.is_floating_point and not cd.is_complex:
        value = int(value)
    else:
        value = float(value)
    return ops.constant(value, cd)


def _standin(x):
    if isinstance(x, IRNode):
        return torch.empty([1] * len(x.get_size()), dtype=x.get_dtype(), device="meta")
    if isinstance(x, sympy.Basic):
        if x.is_Integer or x.is_integer:
            return 1
        return 1.0
    return x


def promote(args, kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT):
    """(computation dtype, result dtype) as eager's elementwise type promotion."""
    standins = [_standin(a) for a in args if a is not None]
    return elementwise_dtypes(*standins, type_promotion_kind=kind)


def broadcast_shapes(*sizes: Sequence) -> list[sympy.Expr]:
    n = max((len(s) for s in sizes), default=0)
    out: list[sympy.Expr] = []
    for k in range(n):
        dim = sympy.Integer(1)
        for s in sizes:
            j = k - (n - len(s))
            if j < 0:
                continue
            d = sympify(s[j])
            if d == 1:
                continue
            if dim == 1:
                dim = d
            elif not statically_known_equal(dim, d):
                g = _current[-1] if _current else None
                if g is not None:
                    g.sizevars.guards.append(sympy.Eq(dim, d))
        out.append(dim)
    return out


def broadcast_loader(x: IRNode, out_size: Sequence) -> Callable:
    """Loader of ``x`` indexed by an index over ``out_size`` (numpy broadcasting)."""
    loader = x.make_loader()
    size = [sympify(s) for s in x.get_size()]
    n, k = len(out_size), len(size)
    drop = n - k
    if drop == 0 and all(s != 1 or sympify(o) == 1 for s, o in zip(size, out_size, strict=False)):
        return loader
    zero = sympy.Integer(0)

    def bl(index):
        idx = list(index)[drop:]
        return loader([zero if s == 1 else i for i, s in zip(idx, size, strict=False)])

    return bl


def broadcast_to(x: IRNode, out_size: Sequence) -> IRNode:
    out_size = [sympify(s) for s in out_size]
    if [sympify(s) for s in x.get_size()] == out_size:
        return x
    return GenericView(x, out_size, _broadcast_reindex(x.get_size(), out_size))


def _broadcast_reindex(size, out_size):
    size = [sympify(s) for s in size]
    drop = len(out_size) - len(size)
    zero = sympy.Integer(0)

    def reindex(index):
        idx = list(index)[drop:]
        return [zero if s == 1 else i for i, s in zip(idx, size, strict=False)]

    return reindex


def make_pointwise(fn: Callable, kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
                   override_compute_dtype: torch.dtype | None = None,
                   override_result_dtype: torch.dtype | None = None,
                   result_is_compute: bool = False):
    """A lowering for an elementwise op: broadcasting, type promotion, scalars.

    ``fn(*values)`` builds the body from ops values (all in the compute dtype: the promoted
    computation dtype, float32 for half types). The result is converted to the result dtype
    unless ``result_is_compute`` (fn already returns values of the result's compute dtype,
    e.g. comparisons returning bool)."""

    def lower_fn(*args):
        tensors = [a for a in args if isinstance(a, IRNode)]
        if not tensors:
            raise LoweringError("pointwise op without tensor arguments")
        comp, res = promote(args, kind)
        if override_compute_dtype is not None:
            comp = override_compute_dtype
        if override_result_dtype is not None:
            res = override_result_dtype
        comp = compute_dtype(comp)
        out_size = broadcast_shapes(*[t.get_size() for t in tensors])
        device = _common_device(tensors)
        loaders = []
        for a in args:
            if isinstance(a, IRNode):
                ld = broadcast_loader(a, out_size)
                loaders.append((ld, a.get_dtype()))
            else:
                loaders.append((a, None))

        def inner_fn(index):
            vals = []
            for ld, dt in loaders:
                if dt is None:
                    vals.append(constant_value(ld, comp) if ld is not None else None)
                else:
                    vals.append(to_dtype(ld(index), dt, comp) if compute_dtype(dt) != comp else ld(index))
            out = fn(*vals)
            if result_is_compute:
                return out
            return to_dtype(out, comp, res)

        return Pointwise(device, res, out_size, inner_fn)

    return lower_fn


def _common_device(tensors) -> torch.device:
    devs = [t.get_device() for t in tensors]
    for d in devs:
        if d.type != "cpu":
            return d
    return devs[0] if devs else torch.device("cpu")


def pointwise_from(x: IRNode, fn: Callable, dtype=None) -> Pointwise:
    """A Pointwise over x's size with ``fn(loaded value) -> value`` (dtype defaults to x's)."""
    loader = x.make_loader()
    return Pointwise(x.get_device(), dtype or x.get_dtype(), x.get_size(), lambda idx: fn(loader(idx)))


# --------------------------------------------------------------------------------------------
# the graph walker
# --------------------------------------------------------------------------------------------

_logged_fallbacks: set[str] = set()


def _op_name(op) -> str:
    """``aten::mul.Tensor`` / ``aten::sin.default`` / a Python callable's name."""
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{getattr(op, '_overloadname', '') or 'default'}"
    return str(getattr(op, "__name__", op))


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs=None):
        self.gm = gm
        self.example_inputs = list(example_inputs) if example_inputs is not None else None
        self.graph = LoopGraph()
        self.sizevars = SizeVarAllocator()
        self.env: dict[torch.fx.Node, Any] = {}
        self._const_count = 0
        self.current_node: torch.fx.Node | None = None
        self.pending_copies: list = []  # (input buffer, new value, meta) of copy_ write-backs
        self.random_state = None  # the seed buffer and next offset of philox ops (lowerings/random.py)

    # ---- helpers -------------------------------------------------------------------------
    def expr(self, x):
        return self.sizevars.to_expr(x)

    def layout_of(self, val: torch.Tensor) -> Layout:
        """Layout of a tensor value; offset 0: buffers are addressed from their data pointer."""
        return Layout(val.device, val.dtype, [self.expr(s) for s in val.shape],
                      [self.expr(s) for s in val.stride()], 0)

    def _meta(self, node):
        if "val" in node.meta:
            return node.meta["val"]
        return node.meta.get("example_value")

    # ---- main ----------------------------------------------------------------------------
    def run(self) -> LoopGraph:
        _current.append(self)
        try:
            self._run()
        finally:
            _current.pop()
        counters["graphs_lowered"] += 1
        return self.graph

    def _run(self):
        nodes = list(self.gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.graph.num_placeholders = len(placeholders)
        # first pass: bind every symbol readable from the inputs' sizes (in placeholder order)
        vals = []
        for pos, n in enumerate(placeholders):
            val = self._meta(n)
            if val is None and self.example_inputs is not None and pos < len(self.example_inputs):
                val = self.example_inputs[pos]
            vals.append(val)
            if isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    self.sizevars.bind(s, SizeVarSource(pos, d))
            elif isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
                self.sizevars.bind(val, SizeVarSource(pos, None))
        for pos, val in enumerate(vals):
            if isinstance(val, torch.Tensor):
                for d, st in enumerate(val.stride()):
                    self.sizevars.bind(st, SizeVarSource(pos, d, stride=True))
        devices = set()
        for pos, (n, val) in enumerate(zip(placeholders, vals, strict=False)):
            if isinstance(val, torch.Tensor):
                buf = InputBuffer(f"arg{pos}", self.layout_of(val), pos)
                self.graph.add_input(buf)
                self.graph.input_positions.append(len(self.graph.inputs) - 1)
                self.env[n] = buf
                devices.add(val.device)
            elif isinstance(val, (torch.SymInt, torch.SymFloat, int, float, bool)):
                self.graph.input_positions.append(None)
                self.env[n] = self.expr(val) if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool) else val
            elif val is None:
                raise LoweringError(f"placeholder {n.name} has no meta['val'] and no example input")
            else:
                self.graph.input_positions.append(None)
                self.env[n] = val
        for n in nodes:
            if n.op == "call_function":
                v = self._meta(n)
                for t in _tensors_in(v):
                    devices.add(t.device)
        non_cpu = [d for d in devices if d.type != "cpu"]
        self.graph.device = non_cpu[0] if non_cpu else torch.device("cpu")

        self.users = {n: len(n.users) for n in nodes}
        for n in nodes:
            if n.op in ("placeholder",):
                continue
            self.current_node = n
            if n.op == "get_attr":
                self.env[n] = self._get_attr(n)
            elif n.op == "call_function":
                self.env[n] = self._call_function(n)
            elif n.op == "output":
                self._output(n)
            elif n.op == "call_module" or n.op == "call_method":
                raise LoweringError(f"{n.op} nodes are not ATen-level ({n.format_node()})")
        self.current_node = None
        self.graph.sizevars = dict(self.sizevars.sources)
        hints = {}
        for sym, src in self.graph.sizevars.items():
            h = self.sizevars.hint(sym)
            if h is None and src.input is not None and src.buffer is None:
                v = vals[src.input] if src.input < len(vals) else None
                try:
                    if isinstance(v, torch.Tensor) and src.dim is not None:
                        h = int(v.stride(src.dim) if src.stride else v.size(src.dim))
                    elif src.dim is None and v is not None:
                        h = int(v)
                except Exception:
                    h = None
            if h is not None:
                hints[sym] = h
        self.graph.size_hints = hints
        self.graph.meta["size_hints"] = {s.name: v for s, v in hints.items()}
        self.graph.guards = [g for g in self.sizevars.guards if g is not sympy.true]
        unbound = [s for s in self.sizevars.unbound() if _used_symbol(self.graph, s)]
        if unbound:  # e.g. an int read out of a tensor (t.item()) used as a size: no code
            # binds it at run time, so the graph cannot run compiled (the caller runs it eagerly)
            raise LoweringError(f"size symbols {sorted(map(str, unbound))} have no source (sizes "
                                "computed from tensor data, e.g. t.item(), are not bound yet)")
        self.graph.lint()

    # ---- node kinds ----------------------------------------------------------------------
    def new_constant_name(self) -> str:
        """``constN``: the next graph constant's name (``get_attr`` tensors, derived ones)."""
        self._const_count += 1
        return f"const{self._const_count - 1}"

    def _get_attr(self, n):
        obj = self.gm
        for part in n.target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, torch.Tensor):
            name = self.new_constant_name()
            t = obj.detach()
            # positions count from the constant's first element, as everything that binds it
            # does (its data_ptr in kernels, reinterpret_tensor from its own storage offset):
            # a parameter that is a view into a shared buffer (cuDNN's flattened RNN weights)
            # has a storage offset of its own, which must not count twice
            buf = ConstantBuffer(name, Layout(t.device, t.dtype, list(t.shape), list(t.stride()), 0),
                                 t, n.target)
            return self.graph.add_constant(buf)
        return obj

    def _map_arg(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._map_arg(x) for x in a)
        if isinstance(a, dict):
            return {k: self._map_arg(v) for k, v in a.items()}
        if isinstance(a, (torch.SymInt,)):
            return self.expr(a)
        return a

    def _call_function(self, n):
        target = n.target
        meta = self._meta(n)
        if target is operator.getitem:
            base = self.env[n.args[0]]
            return self._post(n, base[n.args[1]])
        # size arithmetic on SymInts (sym_size, operator.mul, ...): read from meta
        if isinstance(meta, (torch.SymInt, int)) and not isinstance(meta, bool) and not _tensors_in(meta):
            if isinstance(meta, torch.SymInt) or target not in lowerings:
                try:
                    return self.expr(meta)
                except Exception:
                    pass
        if isinstance(meta, (torch.SymFloat, torch.SymBool, float, bool)) and not isinstance(meta, torch.Tensor):
            if not (isinstance(meta, (float, bool)) and target in lowerings):
                raise LoweringError(f"{n.format_node()}: symbolic float/bool values are not supported")
        args = self._map_arg(n.args)
        kwargs = self._map_arg(n.kwargs)
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            return self._mutation(n, target, args, kwargs, meta)
        fn = lowerings.get(target)
        if (fn is None and target not in fallbacks and _supported_dtypes(n, meta)
                and not _library_op(target)):
            raise MissingLowering(f"no lowering for {_op_name(target)} ({n.format_node()}): add "
                                  "one with @lowering, or declare fallback(op, reason=...) in "
                                  "kiln_loopir/lowerings/fallbacks.py")
        if fn is not None and not _supported_dtypes(n, meta):
            fn = None  # complex, float8, wide unsigned...: the aten op handles them
        if fn is not None and self._off_device(meta, args, kwargs):
            fn = None  # computed on another device than the kernels': the aten op runs it there
        out = None
        if fn is not None:
            try:
                out = fn(*args, **kwargs)
            except LoweringError as e:  # the lowering declines these arguments
                log.debug("lowering of %s declined (%s): aten fallback", _op_name(target), e)
                out = None
            except Exception as e:
                raise LoweringBug(f"lowering of {_op_name(target)} failed on {n.format_node()}: "
                                  f"{type(e).__name__}: {e}") from e
            else:
                self._check(n, out, meta)
        if out is None:
            out = self.fallback(target, args, kwargs, meta)
        return self._post(n, out)

    def _off_device(self, meta, args, kwargs) -> bool:
        """Does this op compute on, or read, a device other than the graph's (a CUDA graph's
        ``torch.arange(n)`` made on the CPU, position buckets computed from it, a CPU scalar
        tensor multiplied into a CUDA one)? Its kernel would run on the graph's device and
        could not read that memory (Triton: "Pointer argument cannot be accessed"), so such
        ops stay aten calls, which run where their tensors are."""
        device = self.graph.device
        if any(t.device != device for t in _tensors_in(meta)):
            return True
        return any(isinstance(a, IRNode) and a.get_device() != device
                   for a in pytree.tree_leaves((args, kwargs)))

    def _mutation(self, n, target, args, kwargs, meta):
        """A mutating op. Only the functional graphs' write-back ``copy_(input, new_value)`` is
        supported; it is deferred to the end of the graph (after the outputs are realized, so
        nothing reads the input after it changes)."""
        if target is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, InputBuffer):
                self.pending_copies.append((dst, src, meta))
                return dst
        view_op = METADATA_MUTATIONS.get(target)
        if view_op is not None and not isinstance(args[0], InputBuffer):
            # ``x.as_strided_(...)`` on a value the graph computed (a decomposition restriding
            # a pooled result): the view op's value, which every later reader of x sees too
            out = lowerings[view_op](*args, **kwargs)
            self._check(n, out, meta)
            self.env[n.args[0]] = out
            return out
        raise LoweringError(f"{n.format_node()}: the graph mutates a value that is not a graph "
                            "input (functionalize it first)")

    def _check(self, n, out, meta):
        """The lowering's value agrees with the traced one (dtype, sizes), else LoweringBug."""
        where = f"lowering of {_op_name(n.target)} ({n.format_node()})"
        if isinstance(meta, torch.Tensor) and isinstance(out, IRNode):
            if out.get_dtype() != meta.dtype:
                raise LoweringBug(f"{where}: dtype {out.get_dtype()} != meta {meta.dtype}")
            want = [self.expr(s) for s in meta.shape]
            have = out.get_size()
            if len(want) != len(have) or not all(self._same_size(a, b) for a, b in zip(want, have, strict=False)):
                raise LoweringBug(f"{where}: size {have} != meta {want}")
        elif isinstance(meta, (tuple, list)) and isinstance(out, (tuple, list)):
            for m, o in zip(meta, out, strict=False):
                if isinstance(o, IRNode) or o is None:
                    if isinstance(o, IRNode):
                        self._check(n, o, m)
        elif isinstance(meta, torch.Tensor) and not isinstance(out, IRNode):
            raise LoweringBug(f"{where}: returned {type(out).__name__}, expected a tensor")

    def _same_size(self, a, b) -> bool:
        if statically_known_equal(a, b):
            return True
        ha, hb = self.sizevars.hint(a), self.sizevars.hint(b)
        return ha is not None and ha == hb

    def _post(self, n, out):
        """Apply the realization policy to the value of node ``n``."""
        if isinstance(out, Reduction):
            return realize(out, self._preferred_stride(n, out))
        if isinstance(out, Pointwise) and out.realized is None:
            h = _cost(out)
            heavy = (len(h.reads) > REALIZE_READS_THRESHOLD or sum(h.ops.values()) > REALIZE_OPS_THRESHOLD
                     or (not COSTLY_OPS.isdisjoint(h.ops) and _broadcast_by_users(n)))
            nusers = len(n.users)
            if sum(h.ops.values()) > MAX_INLINE_OPS or (nusers > 1 and heavy):
                realize(out, self._preferred_stride(n, out))
        elif isinstance(out, GenericView) and len(n.users) > 1:
            base = out.data  # a view (``cos[None, None]``) several users broadcast: its loop once
            while isinstance(base, GenericView):
                base = base.data
            if (isinstance(base, Pointwise) and base.realized is None
                    and not COSTLY_OPS.isdisjoint(_cost(base).ops) and _broadcast_by_users(n)):
                realize(base)
        return out

    def _preferred_stride(self, n, out):
        from .lowerings.extern import channels_last_strides, runs_channels_last

        if (len(out.get_size()) == 4 and all(u.op != "output" for u in n.users)
                and any(runs_channels_last(u) and u.args[0] is n for u in n.users)):
            return channels_last_strides(out.get_size())  # the input of a channels-last conv
        meta = self._meta(n)
        if isinstance(meta, torch.Tensor) and len(meta.shape) == len(out.get_size()):
            try:
                stride = [self.expr(s) for s in meta.stride()]
                size = out.get_size()
                if is_dense(size, stride):
                    return stride
            except Exception:
                pass
        return None

    def _needs_eager_strides(self, sv, meta) -> bool:
        """A storage-backed output whose strides differ from eager's (dense, or with gaps:
        ``is_storable``), dims of size 1 aside."""
        if not isinstance(meta, torch.Tensor) or len(meta.shape) != len(sv.layout.size):
            return False
        try:
            want = [self.expr(st) for st in meta.stride()]
        except Exception:
            return False
        if not is_storable(sv.layout.size, want):
            return False
        return any(not statically_known_equal(sz, 1) and not statically_known_equal(a, b)
                   for sz, a, b in zip(sv.layout.size, sv.layout.stride, want, strict=True))

    def _output(self, n):
        """Outputs, flattened (pytree order) into ``graph.outputs``."""
        outs = pytree.tree_leaves(n.args[0])
        res = []
        for o in outs:
            v = self.env[o] if isinstance(o, torch.fx.Node) else o
            if isinstance(v, IRNode):
                meta = self._meta(o) if isinstance(o, torch.fx.Node) else None
                sv = as_storage_view(v)
                if sv is not None and self._needs_eager_strides(sv, meta):
                    # e.g. a channels-last conv's result: the graph returns eager's layout
                    v, sv = Pointwise(v.get_device(), v.get_dtype(), v.get_size(), sv.make_loader()), None
                if sv is None:
                    # eager's strides, also where they leave gaps: a training graph's backward
                    # was traced with them for the tensors its forward saves
                    stride = None
                    if isinstance(meta, torch.Tensor):
                        st = [self.expr(s) for s in meta.stride()]
                        if is_storable(v.get_size(), st):
                            stride = st
                    r = realize(v, stride)
                    sv = as_storage_view(r)
                res.append(sv)
            else:
                res.append(v)
        self.graph.outputs = res
        for dst, src, meta in self.pending_copies:
            src_val = src
            if isinstance(src, IRNode):
                size = [sympify(x) for x in dst.get_size()]
                loader = broadcast_loader(src, size)
                s_dt, d_dt = src.get_dtype(), dst.get_dtype()
                if s_dt != d_dt or [sympify(x) for x in src.get_size()] != size:
                    src_val = Pointwise(dst.get_device(), d_dt, size,
                                        lambda idx, ld=loader, a=s_dt, b=d_dt: to_dtype(ld(idx), a, b))
            make_extern(aten.copy_.default, [dst, src_val], {}, meta, fallback=False)

    # ---- fallback ------------------------------------------------------------------------
    def fallback(self, op, args, kwargs, meta, fallback=True) -> Any:
        """An ExternKernel calling ``op`` on realized inputs; output layouts from meta."""
        name = _op_name(op)
        if fallback:
            counters["aten_fallbacks"][name] += 1
            if name not in _logged_fallbacks:
                _logged_fallbacks.add(name)
                log.info("no lowering for %s: calling the aten op (ExternKernel fallback)", name)
        return make_extern(op, args, kwargs, meta, fallback=fallback)


def make_extern(op, args, kwargs, meta, fallback=False):
    g = current()
    eager = _eager_input_strides(g, args, kwargs)

    def conv(a):
        if isinstance(a, IRNode):
            return realize_input(a, eager.get(id(a)))
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        if isinstance(a, dict):
            return {k: conv(v) for k, v in a.items()}
        return a

    cargs = conv(list(args))
    ckwargs = conv(dict(kwargs))
    meta, cargs, ckwargs = extern_result_meta(g, op, cargs, ckwargs, meta)
    if isinstance(meta, torch.Tensor):
        k = ExternKernel(g.graph.new_name(), g.layout_of(meta), op, cargs, ckwargs, fallback)
        g.graph.register_buffer(k)
        _bind_data_dependent_sizes(g, k)
        counters["externs"] += 1
        return k
    k = ExternKernel(g.graph.new_name(), None, op, cargs, ckwargs, fallback)
    g.graph.register_buffer(k)
    counters["externs"] += 1
    if isinstance(meta, (list, tuple)):
        outs = []
        for i, m in enumerate(meta):
            if isinstance(m, torch.Tensor):
                mo = MultiOutput(g.graph.new_name(), g.layout_of(m), k, i)
                g.graph.register_buffer(mo)
                _bind_data_dependent_sizes(g, mo)
                k.outputs.append(mo)
                outs.append(mo)
            elif isinstance(m, (torch.SymInt, int)) and not isinstance(m, bool):
                outs.append(g.expr(m))
            else:
                outs.append(m)
        return type(meta)(outs) if isinstance(meta, tuple) else outs
    if meta is None:
        return None
    raise LoweringError(f"cannot call {op} as an extern kernel: result {type(meta).__name__}")


def _eager_input_strides(g: GraphLowering, args, kwargs) -> dict:
    """id(unrealized input) -> eager's strides for it, where those are dense, not contiguous
    and keep the last dim innermost (the kernel writing it still stores rows contiguously): an
    extern input computed by a loop is written in eager's layout, so the extern
    returns eager's result layout and the views after it stay views (SDPA's query in
    ``[b, t, h, d]`` order gives an output whose ``transpose(1, 2).reshape`` is free; realized
    contiguous, that transpose became a copy)."""
    node = g.current_node
    out: dict = {}
    if node is None or node.op != "call_function":
        return out

    def walk(a, f):
        if isinstance(a, (Pointwise, GenericView)) and getattr(a, "realized", None) is None:
            fake = f.meta.get("val") if isinstance(f, torch.fx.Node) else None
            if isinstance(fake, torch.Tensor) and len(fake.shape) == len(a.get_size()):
                size = [g.expr(s) for s in fake.shape]
                stride = [g.expr(s) for s in fake.stride()]
                if (list(a.get_size()) == size and is_dense(size, stride) and stride and stride[-1] == 1
                        and not has_eager_strides(g, Layout(a.get_device(), a.get_dtype(), size,
                                                            contiguous_strides(size)), fake)):
                    out[id(a)] = stride
        elif isinstance(a, (list, tuple)) and isinstance(f, (list, tuple)) and len(a) == len(f):
            for x, y in zip(a, f, strict=True):
                walk(x, y)

    walk(list(args), list(node.args))
    for k, v in kwargs.items():
        walk(v, node.kwargs.get(k))
    return out


# --------------------------------------------------------------------------------------------
# the layout of an extern's result
# --------------------------------------------------------------------------------------------


class _NoFakeInput(Exception):
    """An extern input whose real layout cannot be given to a fake tensor."""


def extern_result_meta(g: GraphLowering, op, cargs, ckwargs, meta):
    """``(meta, cargs, ckwargs)`` with ``meta`` describing what ``op`` really returns for the
    layouts its realized inputs have.

    The node's ``meta["val"]`` was traced with eager's input layouts, but lowering may give an
    input another one (a value eager keeps permuted realized contiguous, a channels-last conv
    input), and many ops' result layout follows their inputs' (SDPA returns ``[b, h, t, d]``
    laid out like its query, convolution follows the memory format, most aten fallbacks
    preserve strides). Kernels index an extern's result with its buffer's layout, so that
    layout must be the real one: the op is rerun on fake tensors of the real input layouts.
    Where a real layout cannot be faked (a non-dense view under symbolic sizes), that input
    is copied into eager's layout instead, so that the traced ``meta`` holds."""
    node = g.current_node
    if (node is None or node.op != "call_function" or node.target is not op
            or not _tensors_in(meta)):
        return meta, cargs, ckwargs
    pairs: list = []  # (realized input, its traced fake tensor) of inputs whose layout differs
    _mismatched_inputs(cargs, list(node.args), pairs)
    _mismatched_inputs(ckwargs, dict(node.kwargs), pairs)
    if not pairs:
        return meta, cargs, ckwargs
    fake_mode = _fake_mode_of(meta)
    try:
        fakes = {id(c): _fake_like(c, f, fake_mode) for c, f in pairs} | {"mode": fake_mode}
        fargs = _fake_args(cargs, list(node.args), fakes)
        fkwargs = _fake_args(ckwargs, dict(node.kwargs), fakes)
        with fake_mode:
            new_meta = op(*fargs, **fkwargs)
        _same_sizes(g, new_meta, meta)  # e.g. a fresh unbacked size: keep the traced one
    except Exception as e:  # noqa: BLE001  (any failure: fall back to eager's layouts below)
        log.debug("%s: cannot rerun on the real input layouts (%s: %s); copying the inputs "
                  "into eager's layouts", _op_name(op), type(e).__name__, e)
    else:
        return new_meta, cargs, ckwargs
    copies = {id(c): _copy_into_layout(g, c, f, op) for c, f in pairs}
    return meta, _replace_inputs(cargs, copies), _replace_inputs(ckwargs, copies)


def _same_sizes(g: GraphLowering, new_meta, meta) -> None:
    """The rerun's results have the traced results' sizes (else _NoFakeInput)."""
    new, old = _tensors_in(new_meta), _tensors_in(meta)
    if len(new) != len(old) or any(
            [g.expr(s) for s in a.shape] != [g.expr(s) for s in b.shape] for a, b in zip(new, old, strict=True)):
        raise _NoFakeInput("the rerun's result sizes differ from the traced ones")


def has_eager_strides(g: GraphLowering, layout: Layout, fake: torch.Tensor) -> bool:
    """``layout`` has the traced tensor ``fake``'s strides on every dim of size > 1 (a size-1 dim's stride is never multiplied by a
    nonzero index); tensors without elements have no layout to disagree on."""
    size = [g.expr(s) for s in fake.shape]
    if len(size) != len(layout.size) or any(s == 0 for s in size):
        return len(size) == len(layout.size)
    want = [g.expr(s) for s in fake.stride()]
    hints = _ordering_hints(list(layout.stride) + want)
    return all(sz == 1 or _equal(a, b, hints) for sz, a, b in zip(size, layout.stride, want, strict=True))


def _equal(a, b, hints: dict) -> bool:
    """``a == b`` for size expressions, cheapest test first: structure, a numeric point (a
    difference there settles it), expansion, then SymPy's simplify."""
    a, b = sympify(a), sympify(b)
    if a == b:
        return True
    if a.is_Integer and b.is_Integer:
        return False
    try:
        if int(a.subs(hints)) != int(b.subs(hints)):
            return False
    except (TypeError, ValueError):
        pass
    return sympy.expand(a - b) == 0 or statically_known_equal(a, b)


def _mismatched_inputs(cargs, fx_args, out: list) -> None:
    """Walk a realized argument structure beside the FX node's: collect (input, fake) pairs
    whose layouts differ."""
    if isinstance(cargs, (Buffer, ReinterpretView)):
        fake = fx_args.meta.get("val") if isinstance(fx_args, torch.fx.Node) else None
        lay = cargs.layout
        if isinstance(fake, torch.Tensor) and lay is not None and not has_eager_strides(current(), lay, fake):
            out.append((cargs, fake))
    elif isinstance(cargs, (list, tuple)) and isinstance(fx_args, (list, tuple)):
        for c, f in zip(cargs, fx_args, strict=False):
            _mismatched_inputs(c, f, out)
    elif isinstance(cargs, dict) and isinstance(fx_args, dict):
        for k, c in cargs.items():
            _mismatched_inputs(c, fx_args.get(k), out)


def _fake_mode_of(meta):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for t in _tensors_in(meta):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _fake_like(c, fake: torch.Tensor, fake_mode) -> torch.Tensor:
    """A fake tensor with ``fake``'s (possibly symbolic) sizes and ``c``'s real layout."""
    lay = c.layout
    size, stride = [sympify(s) for s in lay.size], [sympify(s) for s in lay.stride]
    with fake_mode:
        if all(e.is_Integer for e in size + stride):
            return torch.empty_strided([int(s) for s in size], [int(s) for s in stride],
                                       dtype=fake.dtype, device=fake.device)
        order = _dense_order(size, stride)
        if order is None:
            raise _NoFakeInput(f"{c.name}: layout {lay} is not dense")
        return torch.empty_permuted(fake.shape, order, dtype=fake.dtype, device=fake.device)


def _dense_order(size, stride) -> list[int] | None:
    """Dims from outermost to innermost if ``size``/``stride`` is a permuted contiguous layout."""
    if not is_dense(size, stride):
        return None
    hint = _ordering_hints([sympify(e) for e in size + stride])
    keys = [(-int(sympify(st).subs(hint)), -int(sympify(sz).subs(hint)) if sympify(sz) != 1 else 1)
            for sz, st in zip(size, stride, strict=True)]
    return sorted(range(len(size)), key=lambda d: keys[d])


def _fake_args(cargs, fx_args, fakes: dict):
    """The FX node's arguments as the op sees them under fake mode, with each mismatched
    input replaced by its fake of the real layout."""
    if id(cargs) in fakes:
        return fakes[id(cargs)]
    if isinstance(fx_args, torch.fx.Node):
        if "val" in fx_args.meta:
            return fx_args.meta["val"]
        if not isinstance(cargs, (Buffer, ReinterpretView)):
            raise _NoFakeInput(f"{fx_args.name} has no meta['val']")
        lay = cargs.layout  # e.g. a hand-built graph's constant: its static layout
        if not all(sympify(e).is_Integer for e in list(lay.size) + list(lay.stride)):
            raise _NoFakeInput(f"{fx_args.name} has no meta['val'] and a symbolic layout")
        with fakes["mode"]:
            return torch.empty_strided([int(e) for e in lay.size], [int(e) for e in lay.stride],
                                       dtype=lay.dtype, device=lay.device)
    if isinstance(fx_args, (list, tuple)):
        cs = cargs if isinstance(cargs, (list, tuple)) and len(cargs) == len(fx_args) else [None] * len(fx_args)
        return type(fx_args)(_fake_args(c, f, fakes) for c, f in zip(cs, fx_args, strict=True))
    if isinstance(fx_args, dict):
        cs = cargs if isinstance(cargs, dict) else {}
        return {k: _fake_args(cs.get(k), f, fakes) for k, f in fx_args.items()}
    return fx_args


def _copy_into_layout(g: GraphLowering, c, fake: torch.Tensor, op) -> Buffer:
    """``c`` copied into a new buffer with ``fake``'s (eager's) strides."""
    stride = [g.expr(s) for s in fake.stride()]
    if not is_dense(c.get_size(), stride):
        raise NotImplementedError(
            f"extern {_op_name(op)}: input {c.name} has layout {c.layout}, eager's strides "
            f"{stride} are not dense, and the op cannot be rerun on the real layout")
    return realize(Pointwise(c.get_device(), c.get_dtype(), c.get_size(), c.make_loader()), stride)


def _replace_inputs(cargs, copies: dict):
    if id(cargs) in copies:
        return copies[id(cargs)]
    if isinstance(cargs, (list, tuple)):
        return type(cargs)(_replace_inputs(c, copies) for c in cargs)
    if isinstance(cargs, dict):
        return {k: _replace_inputs(v, copies) for k, v in cargs.items()}
    return cargs


#: dtypes loop bodies compute in; nodes touching others take the aten fallback
SUPPORTED_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                              torch.int64, torch.float16, torch.bfloat16, torch.float32,
                              torch.float64})


def _supported_dtypes(n: torch.fx.Node, meta) -> bool:
    vals = _tensors_in(meta)
    for a in n.all_input_nodes:
        v = a.meta.get("val", a.meta.get("example_value"))
        vals += _tensors_in(v)
    return all(t.dtype in SUPPORTED_DTYPES for t in vals)


def _bind_data_dependent_sizes(g: GraphLowering, buf: Buffer) -> None:
    """A size only known once an extern ran (nonzero, unique, ...): read it from its result."""
    for d, sz in enumerate(buf.layout.size):
        if isinstance(sz, sympy.Symbol) and sz not in g.sizevars.sources:
            g.sizevars.sources[sz] = SizeVarSource(buffer=buf.name, dim=d)


def is_storable(size, stride) -> bool:
    """size/stride can be written by a kernel and allocated by ``empty_strided``: dense, or
    static, positive and non-overlapping with gaps (eager's layout for a slice of a wider
    tensor, e.g. one gate's chunk of a GRU's [N, 3H] projection: stride 3H, not H)."""
    if is_dense(size, stride):
        return True
    dims = [(sympify(st), sympify(sz)) for sz, st in zip(size, stride, strict=True) if sympify(sz) != 1]
    if not all(st.is_Integer and sz.is_Integer for st, sz in dims):
        return False
    reach = 1  # every position a dim of smaller stride reaches is below the next stride
    for st, sz in sorted((int(st), int(sz)) for st, sz in dims):
        if st < reach:
            return False
        reach = st * sz
    return True


def is_dense(size, stride) -> bool:
    """size/stride is a permutation of a contiguous layout (non-overlapping and dense)."""
    dims = [(sympify(st), sympify(sz)) for sz, st in zip(size, stride, strict=False) if sympify(sz) != 1]
    if not dims:
        return True
    # order by stride (numeric where possible)
    try:
        subs = _ordering_hints([e for d in dims for e in d])
        dims.sort(key=lambda d: int(d[0].subs(subs)))
    except Exception:
        return False
    expect = sympy.Integer(1)
    for st, sz in dims:
        if not _equal(st, expect, subs):
            return False
        expect = expect * sz
    return True


def _ordering_hints(exprs) -> dict:
    """Large distinct values for the size symbols in ``exprs``, to order strides numerically
    (small ones collapse sizes such as ``(s1 - 1)//16 + 1`` to 1 and tie their strides)."""
    syms = sorted(set().union(*[sympify(e).free_symbols for e in exprs]), key=lambda s: s.name)
    return {s: 10007 + 1009 * k for k, s in enumerate(syms)}


def _numel_hint(n) -> int | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    if not isinstance(v, torch.Tensor):
        return None
    numel = v.numel()
    if isinstance(numel, torch.SymInt):  # its hint, never int(): that would specialize the size
        numel = numel.node.hint
    return numel if isinstance(numel, int) else None


def _broadcast_by_users(n: torch.fx.Node, depth: int = 4) -> bool:
    """Some consumer of ``n`` (looking through up to ``depth`` nodes of the same size, e.g.
    ``unsqueeze``) has more elements than ``n``: it reads each element of ``n`` several times."""
    own = _numel_hint(n)
    if own is None:
        return False
    frontier = list(n.users)
    for _ in range(depth):
        nxt = []
        for u in frontier:
            k = _numel_hint(u)
            if k is None:
                continue
            if k > own:
                return True
            if k == own:
                nxt.extend(u.users)
        frontier = nxt
    return False


def _cost(pw: Pointwise):
    from .analysis import body_deps

    idx = [index_symbol(k) for k in range(len(pw.ranges))]
    return body_deps(pw.inner_fn, idx)


def _tensors_in(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            out += _tensors_in(x)
        return out
    return []


def _used_symbol(graph: LoopGraph, s) -> bool:
    for b in graph.buffers:
        if b.layout is not None and any(s in sympify(e).free_symbols for e in b.layout.size):
            return True
    return False


def lower(aten_gm: torch.fx.GraphModule, example_inputs=None) -> LoopGraph:
    """ATen FX GraphModule (nodes with ``meta["val"]``) -> LoopGraph."""
    from . import lowerings as _families  # noqa: F401  (registers every lowering)

    _ensure_meta(aten_gm, example_inputs)
    return GraphLowering(aten_gm, example_inputs).run()


def meta_val():
    """``meta["val"]`` of the FX node being lowered (None outside a node)."""
    g = current()
    n = g.current_node
    return None if n is None else g._meta(n)


def _ensure_meta(gm, example_inputs) -> None:
    """Hand-built graphs may lack ``meta["val"]``: propagate fake tensors from the inputs."""
    missing = [n for n in gm.graph.nodes
               if n.op in ("placeholder", "call_function", "get_attr")
               and "val" not in n.meta and "example_value" not in n.meta]
    if not missing:
        return
    if example_inputs is None:
        raise LoweringError("the graph lacks meta['val']; pass example_inputs to lower()")
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    fake_mode = None
    for x in example_inputs:
        if isinstance(x, FakeTensor):
            fake_mode = x.fake_mode
            break
    if fake_mode is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode=fake_mode).propagate(*example_inputs)
