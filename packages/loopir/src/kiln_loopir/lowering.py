"""The lowering registry and what lowerings build with.

    @lowering(aten.sin.default)
    def sin(x): ...            # receives IRNodes / Python values / SymPy exprs, returns an IRNode

This module knows no particular lowering and does not walk graphs: the families in
``lowerings/`` register into its tables (``lowerings``, ``fallbacks``) and build their values
with its helpers (``realize``, ``make_pointwise``, ``make_extern``, ``broadcast_*``,
``to_dtype``, ...); ``graph_lowering`` (``lower()``, ``GraphLowering``) walks an ATen graph and
calls them, and lowerings reach the graph being built through ``current()``.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sympy
import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .counters import counters
from .ir.values import (
    Buffer,
    ComputedBuffer,
    ExternKernel,
    GenericView,
    IRNode,
    Layout,
    MultiOutput,
    Pointwise,
    Reduction,
    ReinterpretView,
    compute_dtype,
)
from .sizevars import (
    SizeVarSource,
    contiguous_strides,
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
    "LoweringError",
    "current",
    "lowering_graph",
    "op_name",
    "tensors_in",
    "realize",
    "realize_input",
    "make_pointwise",
    "meta_val",
    "is_dense",
    "has_eager_strides",
    "to_dtype",
    "constant_value",
    "broadcast_to",
]


#: op -> lowering function
lowerings: dict[Any, Callable] = {}
#: op -> why it runs as a call of the aten op (declared with ``fallback(op, reason=...)``)
fallbacks: dict[Any, str] = {}


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
        raise ValueError(f"{op_name(op)} already has a lowering "
                         f"({fn.__module__}.{fn.__qualname__}): one lowering per op")
    if op in fallbacks:
        raise ValueError(f"{op_name(op)} is already declared an aten fallback ({fallbacks[op]})")


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

_current: list = []


def current():
    """The ``graph_lowering.GraphLowering`` being run."""
    if not _current:
        raise RuntimeError("no graph is being lowered")
    return _current[-1]


@contextmanager
def lowering_graph(g) -> Iterator:
    """``current()`` is ``g`` inside."""
    _current.append(g)
    try:
        yield g
    finally:
        _current.pop()


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
        if (via := x.realize_via_base(stride)) is not None:  # lowerings.views.ViewOfLoop
            return via
        loader = x.make_loader()
        return realize(Pointwise(x.get_device(), x.get_dtype(), x.get_size(), loader), stride)
    raise TypeError(f"cannot realize {x!r}")


def realize_input(x: IRNode, stride=None) -> Buffer | ReinterpretView:
    """For extern inputs: a buffer or a strided view of one (a fresh buffer gets ``stride``,
    default contiguous; a broadcast of a loop stays a stride-0 view of the loop's buffer)."""
    if stride is None and isinstance(x, GenericView) and (via := x.broadcast_via_base()) is not None:
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


def op_name(op) -> str:
    """``aten::mul.Tensor`` / ``aten::sin.default`` / a Python callable's name."""
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{getattr(op, '_overloadname', '') or 'default'}"
    return str(getattr(op, "__name__", op))


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


def _eager_input_strides(g, args, kwargs) -> dict:
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


def extern_result_meta(g, op, cargs, ckwargs, meta):
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
            or not tensors_in(meta)):
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
                  "into eager's layouts", op_name(op), type(e).__name__, e)
    else:
        return new_meta, cargs, ckwargs
    copies = {id(c): _copy_into_layout(g, c, f, op) for c, f in pairs}
    return meta, _replace_inputs(cargs, copies), _replace_inputs(ckwargs, copies)


def _same_sizes(g, new_meta, meta) -> None:
    """The rerun's results have the traced results' sizes (else _NoFakeInput)."""
    new, old = tensors_in(new_meta), tensors_in(meta)
    if len(new) != len(old) or any(
            [g.expr(s) for s in a.shape] != [g.expr(s) for s in b.shape] for a, b in zip(new, old, strict=True)):
        raise _NoFakeInput("the rerun's result sizes differ from the traced ones")


def has_eager_strides(g, layout: Layout, fake: torch.Tensor) -> bool:
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

    for t in tensors_in(meta):
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


def _copy_into_layout(g, c, fake: torch.Tensor, op) -> Buffer:
    """``c`` copied into a new buffer with ``fake``'s (eager's) strides."""
    stride = [g.expr(s) for s in fake.stride()]
    if not is_dense(c.get_size(), stride):
        raise NotImplementedError(
            f"extern {op_name(op)}: input {c.name} has layout {c.layout}, eager's strides "
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


def _bind_data_dependent_sizes(g, buf: Buffer) -> None:
    """A size only known once an extern ran (nonzero, unique, ...): read it from its result."""
    for d, sz in enumerate(buf.layout.size):
        if isinstance(sz, sympy.Symbol) and sz not in g.sizevars.sources:
            g.sizevars.sources[sz] = SizeVarSource(buffer=buf.name, dim=d)


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


def tensors_in(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            out += tensors_in(x)
        return out
    return []


def meta_val():
    """``meta["val"]`` of the FX node being lowered (None outside a node)."""
    g = current()
    n = g.current_node
    return None if n is None else g._meta(n)


