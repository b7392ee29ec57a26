"""ATen FX graph -> LoopGraph: the graph walker.

``lower(aten_gm)`` walks the graph: placeholders become ``InputBuffer``s (``arg0, arg1, ...``),
``get_attr`` tensors ``ConstantBuffer``s, each ``call_function`` goes through its lowering (the
``lowering`` module's table, which importing ``lowerings`` fills), and the output node
realizes the outputs. Values flowing between lowerings are IRNodes: unrealized ``Pointwise``
loops (so pointwise producers inline into their consumers), views (``ReinterpretView`` /
``GenericView``: index arithmetic), or buffers.

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
where that is dense with the last dim innermost (``lowering._eager_input_strides``: SDPA then
returns eager's layout and the transpose after it stays a view), and several strided views of
one loop realize the loop once (``lowerings.views.ViewOfLoop``), not one copy per view.

Nodes touching dtypes loop bodies do not compute in, nodes on another device than the
graph's, and ops other libraries registered take the aten fallback; an op with neither a
lowering nor a declared fallback raises ``MissingLowering`` (see ``lowering``).
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree

from . import lowerings as _families  # noqa: F401  (importing the package registers every lowering)
from .analysis import body_deps
from .counters import counters
from .ir.graph import LoopGraph
from .ir.values import (
    ConstantBuffer,
    GenericView,
    InputBuffer,
    IRNode,
    Layout,
    Pointwise,
    Reduction,
)
from .ir.verify import verify_graph
from .lowering import (
    LoweringBug,
    LoweringError,
    MissingLowering,
    as_storage_view,
    broadcast_loader,
    fallbacks,
    is_dense,
    lowering_graph,
    lowerings,
    make_extern,
    op_name,
    realize,
    tensors_in,
    to_dtype,
)
from .lowerings.extern import EXTERN_OPS, channels_last_strides, runs_channels_last
from .sizevars import SizeVarAllocator, SizeVarSource, index_symbol, statically_known_equal, sympify

log = logging.getLogger("kiln.loopir")

aten = torch.ops.aten

__all__ = [
    "lower",
    "GraphLowering",
    "is_storable",
    "REALIZE_READS_THRESHOLD",
    "REALIZE_OPS_THRESHOLD",
    "MAX_INLINE_OPS",
    "COSTLY_OPS",
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
#: a value computing a COSTLY_OPS op that two or more consumers read is computed once, unless
#: its consumers are its own row reductions and what combines it with them (softmax, LayerNorm:
#: the C++ codegen keeps such a row in a thread-local buffer). Inlined, every consumer evaluates
#: it again: Whisper's GELU of the convolution plus positions, read by LayerNorm and by the
#: residual add after attention, cost erf four times per element
REALIZE_SHARED_COSTLY = True


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


_logged_fallbacks: set[str] = set()


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
        with lowering_graph(self):
            self._run()
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
                for t in tensors_in(v):
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
        verify_graph(self.graph)

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
        if isinstance(meta, (torch.SymInt, int)) and not isinstance(meta, bool) and not tensors_in(meta):
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
            raise MissingLowering(f"no lowering for {op_name(target)} ({n.format_node()}): add "
                                  "one with @lowering, or declare fallback(op, reason=...) in "
                                  "kiln_loopir/lowerings/fallbacks.py")
        if fn is not None and not _supported_dtypes(n, meta) and target not in EXTERN_OPS:
            fn = None  # complex, float8, wide unsigned...: the aten op handles them (an extern
            # lowering calls the aten op already: float8's _scaled_mm stays an extern call)
        if fn is not None and self._off_device(meta, args, kwargs):
            fn = None  # computed on another device than the kernels': the aten op runs it there
        out = None
        if fn is not None:
            try:
                out = fn(*args, **kwargs)
            except LoweringError as e:  # the lowering declines these arguments
                log.debug("lowering of %s declined (%s): aten fallback", op_name(target), e)
                out = None
            except Exception as e:
                raise LoweringBug(f"lowering of {op_name(target)} failed on {n.format_node()}: "
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
        if any(t.device != device for t in tensors_in(meta)):
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
        where = f"lowering of {op_name(n.target)} ({n.format_node()})"
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
            costly = not COSTLY_OPS.isdisjoint(h.ops)
            heavy = (len(h.reads) > REALIZE_READS_THRESHOLD or sum(h.ops.values()) > REALIZE_OPS_THRESHOLD
                     or (costly and (_broadcast_by_users(n) or (
                         REALIZE_SHARED_COSTLY and not _read_by_its_row_reductions(n)))))
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
        if (len(out.get_size()) == 4 and all(u.op != "output" for u in n.users)
                and any(runs_channels_last(u) and u.args[0] is n for u in n.users)):
            return channels_last_strides(out.get_size())  # the input of a channels-last conv
        if (isinstance(out, Pointwise) and all(u.op != "output" for u in n.users)
                and _reads_channels_last(out)):
            return channels_last_strides(out.get_size())
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
        name = op_name(op)
        if fallback:
            counters["aten_fallbacks"][name] += 1
            if name not in _logged_fallbacks:
                _logged_fallbacks.add(name)
                log.info("no lowering for %s: calling the aten op (ExternKernel fallback)", name)
        return make_extern(op, args, kwargs, meta, fallback=fallback)


#: dtypes loop bodies compute in; nodes touching others take the aten fallback
SUPPORTED_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                              torch.int64, torch.float16, torch.bfloat16, torch.float32,
                              torch.float64})


def _supported_dtypes(n: torch.fx.Node, meta) -> bool:
    vals = tensors_in(meta)
    for a in n.all_input_nodes:
        v = a.meta.get("val", a.meta.get("example_value"))
        vals += tensors_in(v)
    return all(t.dtype in SUPPORTED_DTYPES for t in vals)


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


def _numel_hint(n) -> int | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    if not isinstance(v, torch.Tensor):
        return None
    numel = v.numel()
    if isinstance(numel, torch.SymInt):  # its hint, never int(): that would specialize the size
        numel = numel.node.hint
    return numel if isinstance(numel, int) else None


def _read_by_its_row_reductions(n: torch.fx.Node, depth: int = 3) -> bool:
    """Every user of ``n`` reduces it (has fewer elements) or combines it with such a reduction
    (within ``depth`` nodes up): softmax's ``exp`` read by its sum and the division, LayerNorm's
    input read by its statistics and the normalization."""
    own = _numel_hint(n)
    if own is None:
        return True
    reducers = {u for u in n.users if (k := _numel_hint(u)) is not None and k < own}
    if not reducers:
        return False
    for u in n.users:
        if u in reducers:
            continue
        seen, frontier, found = set(), [a for a in u.all_input_nodes if a is not n], False
        for _ in range(depth):
            if found or not frontier:
                break
            found = any(a in reducers for a in frontier)
            seen.update(frontier)
            frontier = [b for a in frontier for b in a.all_input_nodes if b not in seen and b is not n]
        if not found:
            return False
    return True


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


def _reads_channels_last(pw: Pointwise) -> bool:
    """A 4-d pointwise value whose every full-size read is channels-last (a channels-last
    convolution's result, its activation): realized channels-last too, not in eager's NCHW,
    so the reductions and products after it (squeeze-excite's pool and gate) read it
    contiguously and the next convolution's input is not one more transposing copy."""
    size = pw.get_size()
    if len(size) != 4 or any(not sympify(d).is_Integer for d in size) or int(size[1]) == 1 \
            or int(size[2]) * int(size[3]) == 1:
        return False
    idx = [index_symbol(k) for k in range(4)]
    votes = set()
    for dep in _cost(pw).reads:
        e = sympify(dep.index)
        if not all(s in e.free_symbols for s in idx):
            continue  # a broadcast read (per-channel constants, a pooled gate)
        at0 = e.xreplace({s: 0 for s in idx})
        strides = [e.xreplace({s: (1 if s is t else 0) for s in idx}) - at0 for t in idx]
        if not all(st.is_Integer for st in strides):
            return False
        if strides[1] == 1 and strides[3] > 1:
            votes.add("channels_last")
        else:
            votes.add("other")
    return votes == {"channels_last"}


def _cost(pw: Pointwise):
    idx = [index_symbol(k) for k in range(len(pw.ranges))]
    return body_deps(pw.inner_fn, idx)


def _used_symbol(graph: LoopGraph, s) -> bool:
    for b in graph.buffers:
        if b.layout is not None and any(s in sympify(e).free_symbols for e in b.layout.size):
            return True
    return False


def lower(aten_gm: torch.fx.GraphModule, example_inputs=None) -> LoopGraph:
    """ATen FX GraphModule (nodes with ``meta["val"]``) -> LoopGraph."""
    _ensure_meta(aten_gm, example_inputs)
    return GraphLowering(aten_gm, example_inputs).run()


def _ensure_meta(gm, example_inputs) -> None:
    """Hand-built graphs may lack ``meta["val"]``: propagate fake tensors from the inputs."""
    missing = [n for n in gm.graph.nodes
               if n.op in ("placeholder", "call_function", "get_attr")
               and "val" not in n.meta and "example_value" not in n.meta
               and not (n.op == "get_attr"  # a higher-order operator's body: no value
                        and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule))]
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
