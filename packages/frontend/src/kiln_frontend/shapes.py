"""Dynamic shapes: which input dimensions are symbols, the symbolic fakes, SymInt trackers
and the shape guards.

Three ways a dimension of a tensor taken from the frame becomes a symbol (``s0, s1, ...``
numbered in order of creation):

* ``dynamic=True``: every dimension of every input tensor (sizes 0 and 1 stay
  specialized, as torch.compile does: a kernel for size 1 differs from the general one);
* ``mark_dynamic(t, dim)``: that dimension, whatever ``dynamic`` says;
* automatic (``dynamic=None``, the default): a frame is first compiled with static sizes;
  when a size change makes it recompile, the dimensions that changed are symbols from then
  on (``dynamic=False`` turns this off).

Symbols live in a ``torch.fx.experimental.symbolic_shapes.ShapeEnv`` (``KilnShapeEnv``)
shared by the frame's ``FakeTensorMode``; fake tensors of dynamic inputs carry ``SymInt``
sizes, so ``x.shape[0] * 2`` or ``x.view(x.size(0), -1)`` in the frame become SymInt nodes
of the graph (``SymNodeVariable``).  A symbol read directly (``x.shape[0]``) is a graph
input of its own: a ``Sym(s0)`` placeholder whose value the transformed code passes as
``x.shape[0]`` (torch.compile lifts sizes the same way); unused symbol placeholders are
pruned like other unused inputs.

Every condition torch's shape machinery assumed while tracing (``ShapeEnv.guards``: ``s0 >
2`` from an ``if``, ``Eq(Mod(s0*s1, 2), 0)`` from a ``view``...), the symbols' ranges
(``>= 2`` because of 0/1 specialization), equalities of duck-sized dimensions and the
strides of dynamic inputs become ``SHAPE_ENV`` guards: Python expressions over the frame's
arguments (``x.size()[0] >= 2``) compiled into the frame's check function, printed and
explained over ``L['x'].size()[0]``.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import sympy
import torch
import torch._guards
import torch.fx
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    GuardOnDataDependentSymNode,
    ShapeEnv,
)
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter

from .exc import Unsupported
from .layers import upper
from .sources import AttrSource, GetItemSource, Source
from .symbolic.variables.base import NotConstant, VariableTracker

#: attribute a tensor carries after ``mark_dynamic`` (a set of dimension indices)
DYNAMIC_DIMS_ATTR = "_kiln_dynamic_dims"
#: key of the automatic-dynamic record in a code's ``frame_state``
FRAME_STATE_KEY = "kiln_input_sizes"
#: key of the automatic-dynamic record of int/float inputs (source name -> value or None)
SCALAR_STATE_KEY = "kiln_input_scalars"

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


# --------------------------------------------------------------------------------------
# user API
# --------------------------------------------------------------------------------------


def mark_dynamic(t: torch.Tensor, index: int | Iterable[int]) -> None:
    """Compile ``t``'s dimension(s) ``index`` with a symbolic size (even under
    ``dynamic=False``).  A dimension of size 0 or 1 is still specialized."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic needs a tensor, not {type(t).__name__}")
    dims = [index] if isinstance(index, int) else list(index)
    marked = set(getattr(t, DYNAMIC_DIMS_ATTR, ()))
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"mark_dynamic: dimension {d!r} out of range for a "
                             f"{t.dim()}-d tensor")
        marked.add(d % t.dim())
    setattr(t, DYNAMIC_DIMS_ATTR, marked)


def mark_static(t: torch.Tensor, index: int | Iterable[int] | None = None) -> None:
    """Undo ``mark_dynamic`` for ``index`` (all dimensions when None)."""
    marked = set(getattr(t, DYNAMIC_DIMS_ATTR, ()))
    if index is None:
        marked.clear()
    else:
        for d in [index] if isinstance(index, int) else index:
            marked.discard(d % t.dim())
    setattr(t, DYNAMIC_DIMS_ATTR, marked)


# --------------------------------------------------------------------------------------
# the ShapeEnv
# --------------------------------------------------------------------------------------


class KilnShapeEnv(ShapeEnv):
    """A ``ShapeEnv`` whose symbols count up (``s0, s1, ...``; torch numbers them by a hash
    of their source's name) and whose guards remember the user's ``file:line`` being traced
    (torch walks the Python stack for that, which also imports its own compiler)."""

    def __init__(self) -> None:
        # data-dependent values (``t.item()``, ``x[x > 0]``, ``nonzero``) are unbacked
        # symbols ``u0, zuf0, ...``: computed by the graph, never guarded (no input holds
        # them); a branch on one is a graph break (GuardOnDataDependentSymNode)
        super().__init__(allow_scalar_outputs=True, allow_dynamic_output_shape_ops=True)
        #: symbols of dynamic int/float inputs (not sizes): specialized where Python needs
        #: their value (SymNodeVariable.as_python_constant)
        self.scalar_symbols: set[sympy.Symbol] = set()

    def _generate_unique_id(self, source_name: str) -> int:
        uid = len(self.unique_ids)
        self.unique_ids.add(uid)
        return uid

    def _get_stack_summary(self, is_debug: bool = False,
                           framework_loc: str | None = None) -> tuple[Any, str]:
        return torch._guards.SLoc(framework_loc or "kiln", current_user_location()), ""


def current_user_location() -> str | None:
    """``file:line`` of the instruction the innermost running translator is at."""
    frame = sys._getframe(1)
    while frame is not None:
        tx = frame.f_locals.get("self") if frame.f_code.co_name == "step" else None
        if isinstance(tx, upper.InstructionTranslatorBase) and tx.current_inst is not None:
            lineno = tx.current_inst.lineno
            return f"{tx.code.co_filename}:{lineno}" if lineno is not None else None
        frame = frame.f_back
    return None


@dataclasses.dataclass(frozen=True)
class SymbolSource(torch._guards.Source):
    """What ``ShapeEnv.create_symbol`` wants as a source: only its name is used."""

    text: str

    @property
    def _name_template(self) -> str:
        return self.text

    def is_ephemeral(self) -> bool:
        return False


class NeedsShapeEnv(Exception):
    """Raised when a dynamic dimension shows up in a frame traced without a ShapeEnv:
    ``convert_frame`` traces it again with one (made lazily: creating the first ShapeEnv
    of a process costs most of a second)."""


# --------------------------------------------------------------------------------------
# per-frame state
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Binding:
    """Symbol ``symbol`` is ``source.size()[dim]``."""

    source: Source
    dim: int

    def code(self) -> str:
        return f"{self.source.guard_expr()}.size()[{self.dim}]"

    def text(self) -> str:
        return f"{self.source.name()}.size()[{self.dim}]"

    def size_source(self) -> Source:
        return GetItemSource(AttrSource(self.source, "shape"), self.dim)


@dataclasses.dataclass
class ScalarBinding:
    """Symbol ``symbol`` is the int or float found at ``source`` itself."""

    source: Source

    def code(self) -> str:
        return self.source.guard_expr()

    def text(self) -> str:
        return self.source.name()

    def size_source(self) -> Source:
        return self.source


@dataclasses.dataclass
class StrideCheck:
    """A dynamic input's strides, as expressions of the symbols."""

    source: Source
    strides: tuple[Any, ...]  # ints or sympy expressions


class ShapeState:
    """The dynamic-shape bookkeeping of one OutputGraph."""

    def __init__(self, shape_env: KilnShapeEnv):
        self.shape_env = shape_env
        #: symbol -> the input dimensions it stands for (first one binds it)
        self.bindings: dict[sympy.Symbol, list[Binding]] = {}
        #: symbol -> SymNodeVariable of its lifted placeholder (made on first use)
        self.symbol_vars: dict[sympy.Symbol, VariableTracker] = {}
        self.stride_checks: list[StrideCheck] = []


def dynamic_dims_for(output: Any, source: Source, value: torch.Tensor) -> tuple[int, ...]:
    """Which dimensions of input ``value`` (found at ``source``) get symbols, per the
    frame's ``dynamic`` setting, ``mark_dynamic`` and the automatic-dynamic record in
    ``frame_state``."""
    ndim = value.dim()
    if ndim == 0 or value.layout != torch.strided or value.is_nested or \
            hasattr(type(value), "__tensor_flatten__"):  # subclasses: static sizes
        return ()
    dims: set[int] = set(getattr(value, DYNAMIC_DIMS_ATTR, ()))
    dynamic = output.dynamic
    if dynamic is True:
        dims.update(range(ndim))
    elif dynamic is None and output.frame_state is not None:
        record = output.frame_state.setdefault(FRAME_STATE_KEY, {})
        key = source.name()
        sizes = tuple(value.size())
        prev = record.get(key)
        if prev is not None and len(prev) == ndim:
            changed = {i for i in range(ndim) if prev[i] is None or prev[i] != sizes[i]}
            dims.update(changed)
            record[key] = tuple(None if i in changed else sizes[i] for i in range(ndim))
        else:
            record[key] = sizes
    return tuple(sorted(d for d in dims if 0 <= d < ndim))


@upper.provide
def scalar_is_dynamic(output: Any, source: Source, value: int | float) -> bool:
    """Whether an int/float input at ``source`` is a symbol rather than a constant.  As
    torch.compile's automatic dynamic (``specialize_int``/``specialize_float`` off): the
    first compile specializes on its value; once a change of it makes the frame recompile
    it is a symbol from then on, so a loop over ``n`` compiles twice, not once per value.
    ``dynamic=True`` makes it a symbol at once, ``dynamic=False`` never.  Only values
    reached from the frame's arguments (locals) or its own free variables (a closure's
    counter, as torch.compile): a global int stays a constant, and so does an int read
    through an ``nn.Module`` (``self.k``, ``self.cfg.k``: torch.compile takes module ints
    for static)."""
    if output.dynamic is True:
        return True
    if output.dynamic is not None or output.frame_state is None:
        return False
    from .sources import ClosureSource, LocalSource

    if not isinstance(source.root(), (LocalSource, ClosureSource)):  # globals stay
        return False  # specialized, as in torch
    if type(value) is int and _read_through_module(output, source):
        return False
    record = output.frame_state.setdefault(SCALAR_STATE_KEY, {})
    key = source.name()
    if key not in record:
        record[key] = (type(value), value)
        return False
    prev = record[key]
    if prev is None or prev != (type(value), value):
        record[key] = None
        return True
    return False


def _read_through_module(output: Any, source: Source) -> bool:
    """Whether a base of ``source`` is an ``nn.Module`` the trace already holds."""
    base = getattr(source, "base_source", None)
    while base is not None:
        if isinstance(output.source_cache.get(base), upper.NNModuleVariable):
            return True
        base = getattr(base, "base_source", None)
    return False


@upper.provide
def make_dynamic_scalar(output: Any, source: Source, value: int | float) -> VariableTracker:
    """The tracker of a dynamic int/float input: its ``Sym(s0)`` placeholder (the
    transformed code passes the value itself); every condition the trace puts on it
    (``if n > 3``, ``range(n)``) becomes a SHAPE_ENV guard over the source."""
    if output.shape_state is None:
        raise NeedsShapeEnv(source.name())
    state: ShapeState = output.shape_state
    env = state.shape_env
    expr = env.create_unspecified_symbol(value, SymbolSource(source.name()),
                                         DimDynamic.DYNAMIC)
    state.bindings.setdefault(expr, []).append(ScalarBinding(source))
    env.scalar_symbols.add(expr)
    var = _placeholder_for_symbol(output, expr, float if isinstance(value, float) else int)
    assert var is not None
    return var


def _symbolic_strides(value: torch.Tensor, sizes: Sequence[Any]) -> list[Any]:
    """Strides of ``value`` written with the symbolic ``sizes`` where the layout is dense
    in some dimension order (contiguous, channels-last, transposed); others stay ints."""
    strides, real_sizes = list(value.stride()), list(value.size())
    out: list[Any] = [sympy.Integer(s) for s in strides]
    expected_real, expected_sym = 1, sympy.Integer(1)
    for i in sorted(range(len(strides)), key=lambda i: (strides[i], real_sizes[i])):
        if strides[i] == expected_real:
            out[i] = expected_sym
        else:  # not dense here: this stride is a constant, the next ones build on it
            expected_sym = sympy.Integer(strides[i])
        expected_real = strides[i] * real_sizes[i]
        expected_sym = expected_sym * sizes[i]
    return out


def make_dynamic_input(output: Any, source: Source, value: torch.Tensor,
                       dims: tuple[int, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A fake of ``value`` whose ``dims`` have symbolic sizes.  Returns the fake and the
    dimensions that really are symbols (sizes 0/1 are specialized)."""
    state: ShapeState = output.shape_state
    env = state.shape_env
    marked = set(getattr(value, DYNAMIC_DIMS_ATTR, ()))
    sizes: list[Any] = []
    sym_sizes: list[Any] = []
    symbolic_dims = []
    for d, n in enumerate(value.size()):
        if d not in dims:
            sizes.append(n)
            sym_sizes.append(sympy.Integer(n))
            continue
        kind = DimDynamic.DYNAMIC if d in marked else DimDynamic.DUCK
        expr = env.create_symbol(n, SymbolSource(f"{source.name()}.size()[{d}]"), kind)
        sym_sizes.append(expr)
        if isinstance(expr, sympy.Symbol):
            state.bindings.setdefault(expr, []).append(Binding(source, d))
            symbolic_dims.append(d)
            sizes.append(env.create_symintnode(expr, hint=n))
        else:
            sizes.append(int(expr))
    stride_exprs = _symbolic_strides(value, sym_sizes)
    strides = [env.create_symintnode(s, hint=h) if isinstance(s, sympy.Expr)
               and not s.is_number else int(s)
               for s, h in zip(stride_exprs, value.stride(), strict=True)]
    state.stride_checks.append(StrideCheck(source, tuple(stride_exprs)))
    with output.fake_mode:
        fake = torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device,
                                   requires_grad=value.requires_grad)
    return fake, tuple(symbolic_dims)


# --------------------------------------------------------------------------------------
# SymInt trackers
# --------------------------------------------------------------------------------------


def is_symbolic(value: Any) -> bool:
    """True for a SymInt/SymFloat/SymBool that is not a known constant, or a sequence
    holding one."""
    if isinstance(value, _SYM_TYPES):
        return constant_of(value) is None
    if isinstance(value, (tuple, list)):
        return any(is_symbolic(v) for v in value)
    return False


def constant_of(value: Any) -> Any:
    """The Python value of a SymInt/SymFloat/SymBool whose expression is a number."""
    node = value.node
    expr = node.expr
    if expr.is_number or expr in (sympy.true, sympy.false):
        if isinstance(value, torch.SymBool):
            return bool(expr)
        if isinstance(value, torch.SymInt):
            return int(expr)
        return float(expr)
    return None


class SymNodeVariable(VariableTracker):
    """A SymInt/SymFloat/SymBool computed in the graph (``s0 * 2``, ``x.size(1)``).

    ``proxy`` is its node (a ``Sym(s0)`` placeholder for an input's size), ``value`` the
    symbolic value (``node.meta["example_value"]``).  Using it as a Python truth value
    (``if x.shape[0] > 2:``) asks the ShapeEnv, which records the guard that makes the
    answer hold."""

    def __init__(self, proxy: torch.fx.Proxy, value: Any, *, source: Source | None = None):
        super().__init__(source=source)
        self.proxy = proxy
        self.value = value

    @property
    def node(self) -> torch.fx.Node:
        return self.proxy.node

    def python_type(self) -> type:
        if isinstance(self.value, torch.SymBool):
            return bool
        if isinstance(self.value, torch.SymFloat):
            return float
        return int

    def as_proxy(self) -> Any:
        return self.proxy

    def as_example(self) -> Any:
        return self.value

    def as_python_constant(self) -> Any:
        """A dynamic int/float input used where Python needs its value (``range(n)``,
        ``lst[n]``, a builtin folded on constants): specialized, as torch.compile does, with
        a guard that it keeps this value.  Sizes stay symbolic (a NotConstant), and a value
        read out of a tensor has no value to specialize on."""
        node = self.value.node
        scalars = getattr(node.shape_env, "scalar_symbols", ())
        free = node.expr.free_symbols
        if free and not free <= scalars:
            raise NotConstant(f"symbolic size {self.value}")
        return self.evaluate()

    def is_python_constant(self) -> bool:
        """A probe: never specializes (``x[:n]`` stays a symbolic slice)."""
        return False

    def truth_value(self, tx) -> bool:
        return self.evaluate(bool)

    def evaluate(self, as_type: type | None = None) -> Any:
        """Specialize: the value's current int/bool, guarded to stay so.  A value computed
        from tensor data (an unbacked symbol) has no such value: a graph break."""
        try:
            return (as_type or self.python_type())(self.value)
        except GuardOnDataDependentSymNode as e:
            raise Unsupported(f"data-dependent branch on {self.value} "
                              f"(a value read out of a tensor): {first_line(e)}") from e

    def var_getattr(self, tx, name: str) -> VariableTracker:
        raise Unsupported(f"attribute {name!r} of a symbolic size")

    def reconstruct(self, codegen) -> None:
        codegen.load_graph_value(self)

    def describe(self) -> str:
        return f"SymNodeVariable({self.node.name}: {self.value})"


def _placeholder_for_symbol(output: Any, symbol: sympy.Symbol,
                            kind: type = int) -> VariableTracker | None:
    state: ShapeState | None = output.shape_state
    if state is None or symbol not in state.bindings:
        return None
    var = state.symbol_vars.get(symbol)
    if var is not None:
        return var
    binding = state.bindings[symbol][0]
    size_source = binding.size_source()
    hint = state.shape_env.backed_var_to_val.get(symbol)
    if kind is float:
        value = state.shape_env.create_symfloatnode(symbol, hint=float(hint),
                                                    source=SymbolSource(binding.text()))
    else:
        value = state.shape_env.create_symintnode(symbol, hint=None)
    placeholders = [n for n in output.graph.nodes if n.op == "placeholder"]
    ctx = (output.graph.inserting_after(placeholders[-1]) if placeholders
           else output.graph.inserting_before(None))
    with ctx:
        proxy = output.tracer.create_proxy("placeholder", str(symbol), (), {})
    proxy.node.meta["example_value"] = value
    proxy.node.meta["source"] = size_source
    # the backend gets the SymInt as its example input, as torch.compile passes it
    output.graph_inputs.append((proxy.node, size_source, value))
    var = SymNodeVariable(proxy, value, source=size_source)
    state.symbol_vars[symbol] = var
    return var


def wrap_symbolic(output: Any, make_proxy: Any, value: Any) -> VariableTracker:
    """Trackers for a value holding SymInts: constants stay constants, an input's symbol
    is its placeholder, anything else a node (``make_proxy()`` makes it on demand)."""
    from .symbolic.variables.constant import ConstantVariable, is_constant_value
    from .symbolic.variables.containers import TupleVariable

    if isinstance(value, _SYM_TYPES):
        c = constant_of(value)
        if c is not None:
            return ConstantVariable(c)
        expr = value.node.expr
        if isinstance(expr, sympy.Symbol):
            var = _placeholder_for_symbol(output, expr)
            if var is not None:
                return var
        proxy = make_proxy()
        proxy.node.meta["example_value"] = value
        return SymNodeVariable(proxy, value)
    if isinstance(value, (tuple, list)):
        cache: list = []

        def parent():
            if not cache:
                p = make_proxy()
                p.node.meta["example_value"] = value
                cache.append(p)
            return cache[0]

        items = []
        for i, v in enumerate(value):
            if isinstance(v, (tuple, list, *_SYM_TYPES)):
                items.append(wrap_symbolic(output, lambda i=i: parent()[i], v))
            elif is_constant_value(v):
                items.append(ConstantVariable.create(v))
            else:
                raise Unsupported(f"a size holding a {type(v).__name__}")
        if isinstance(value, list):
            from .symbolic.variables.containers import ListVariable

            return ListVariable(items)
        return TupleVariable(items, tuple_cls=type(value))
    return ConstantVariable.create(value)


def tensor_size(tx, tensor_var: Any, dim: int | None = None) -> VariableTracker:
    """``x.shape`` / ``x.size()`` / ``x.size(dim)`` of a tensor with symbolic sizes."""
    output = tx.output
    fake = tensor_var.example_value
    if dim is None:
        value = fake.size()
        return wrap_symbolic(output, lambda: output.tracer.create_proxy(
            "call_method", "size", (tensor_var.as_proxy(),), {}), value)
    return wrap_symbolic(output, lambda: output.tracer.create_proxy(
        "call_method", "size", (tensor_var.as_proxy(), dim), {}), fake.size(dim))


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _captures_scalars(tx) -> bool:
    """``config.capture_scalar_outputs``, whose default (None) follows the root frame's
    ``fullgraph``."""
    from . import config

    if config.capture_scalar_outputs is not None:
        return config.capture_scalar_outputs
    return bool(getattr(tx.root(), "nopython", False))


def scalar_of_tensor(tx, tensor_var: Any, what: str) -> VariableTracker:
    """``t.item()`` (and ``float(t)``/``int(t)``): a graph node whose value is an unbacked
    symbol (``zuf0`` for a float, ``u0`` for an int), as torch.compile captures it.  A frame
    traced without a ShapeEnv is traced again with one."""
    if not _captures_scalars(tx):
        raise Unsupported(f"{what} reads a number out of a tensor (captured under "
                          "fullgraph=True or config.capture_scalar_outputs = True)")
    output = tx.output
    if output.shape_state is None:
        raise NeedsShapeEnv(what)
    # (more than one element: the fake item() raises as eager does, a graph break; a tensor
    # made from constants in the frame has a known value: a constant)
    return output.create_graph_op("call_method", "item", [tensor_var], {},
                                  allow_constant_result=True)


def sym_operator(tx, fn: Any, args: list[VariableTracker]) -> VariableTracker:
    """``operator.<fn>`` on SymInts (and constants): a node computing the new size."""
    try:
        value = fn(*[a.as_example() for a in args])
    except GuardOnDataDependentSymNode as e:
        raise Unsupported(f"operator.{getattr(fn, '__name__', fn)} needs the value of a "
                          f"number read out of a tensor: {first_line(e)}") from e
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"operator.{getattr(fn, '__name__', fn)} on symbolic sizes "
                          f"raised {type(e).__name__}: {e}") from e
    output = tx.output
    return wrap_symbolic(output, lambda: output.tracer.create_proxy(
        "call_function", fn, tuple(a.as_proxy() for a in args), {}), value)


def has_symnode(args: Iterable[VariableTracker]) -> bool:
    return any(isinstance(a, SymNodeVariable) for a in args)


#: operators that are fine on SymInts
SYM_OPERATORS = frozenset({
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.abs, operator.eq,
    operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.iadd,
    operator.isub, operator.imul, operator.ifloordiv, operator.itruediv, operator.imod,
    operator.and_, operator.or_,
})


# --------------------------------------------------------------------------------------
# pruning and guards
# --------------------------------------------------------------------------------------


def prune_unused_size_nodes(graph: torch.fx.Graph) -> None:
    """Drop size computations nothing uses (``x.size()`` read only for constant dims)."""
    for node in reversed(list(graph.nodes)):
        if node.op not in ("call_function", "call_method") or node.users:
            continue
        ex = node.meta.get("example_value")
        if isinstance(ex, _SYM_TYPES) or (isinstance(ex, (tuple, list)) and ex and all(
                isinstance(v, (int, *_SYM_TYPES)) for v in ex)):
            graph.erase_node(node)


class _BindingPrinter(PythonPrinter):
    def __init__(self, names: dict[sympy.Symbol, str]):
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        try:
            return self.names[expr]
        except KeyError:
            raise Unsupported(f"shape guard over an unbound symbol {expr}") from None


@dataclasses.dataclass(frozen=True)
class ShapeCheck:
    """One shape guard: ``code`` over the check function's arguments, ``text`` over
    ``L['x'].size()[0]`` names, ``symbols`` the (text, code) of the sizes it reads."""

    code: str
    text: str
    symbols: tuple[tuple[str, str], ...]
    where: str | None = None

    def __str__(self) -> str:
        return self.text


def _is_bound(v: Any) -> bool:
    return bool(v.is_number) and v not in (int_oo, -int_oo, sympy.oo, -sympy.oo)


def shape_checks(state: ShapeState) -> list[ShapeCheck]:
    """Everything the graph assumed about symbolic sizes, as ShapeChecks."""
    env = state.shape_env
    code_names = {s: b[0].code() for s, b in state.bindings.items()}
    text_names = {s: b[0].text() for s, b in state.bindings.items()}
    code_p, text_p = _BindingPrinter(code_names), _BindingPrinter(text_names)
    out: list[ShapeCheck] = []
    seen: set[str] = set()

    def add(expr: Any, where: str | None = None) -> None:
        if expr is sympy.true or expr == sympy.true:
            return
        if expr is sympy.false or expr == sympy.false:  # pragma: no cover - torch raises first
            raise Unsupported(f"shape condition {expr} can never hold")
        code = code_p.doprint(expr)
        if code in seen:
            return
        seen.add(code)
        syms = tuple(sorted(((text_names[s], code_names[s]) for s in expr.free_symbols
                             if s in code_names), key=lambda t: t[0]))
        out.append(ShapeCheck(code, text_p.doprint(expr), syms, where))

    for g in env.guards:  # first: they say where the user's code assumed them
        add(env.simplify(g.expr), getattr(g.sloc, "maybe_user_loc", None))
    for sym, binds in state.bindings.items():
        first = binds[0]
        for other in binds[1:]:  # duck sizing: equal sizes share a symbol
            code = f"{other.code()} == {first.code()}"
            if code not in seen:
                seen.add(code)
                out.append(ShapeCheck(code, f"{other.text()} == {first.text()}",
                                      ((other.text(), other.code()),
                                       (first.text(), first.code()))))
        vr = env.var_to_range.get(sym)
        if vr is not None:
            if _is_bound(vr.lower):
                add(sympy.Ge(sym, vr.lower))
            if _is_bound(vr.upper):
                add(sympy.Le(sym, vr.upper))
    for sc in state.stride_checks:
        if not any(isinstance(s, sympy.Expr) and not s.is_number for s in sc.strides):
            parts_code = [str(int(s)) for s in sc.strides]
            parts_text = parts_code
        else:
            parts_code = [code_p.doprint(sympy.sympify(s)) for s in sc.strides]
            parts_text = [text_p.doprint(sympy.sympify(s)) for s in sc.strides]
        tup_code = "(" + ", ".join(parts_code) + ("," if len(parts_code) == 1 else "") + ")"
        tup_text = "(" + ", ".join(parts_text) + ("," if len(parts_text) == 1 else "") + ")"
        code = f"{sc.source.guard_expr()}.stride() == {tup_code}"
        if code in seen:
            continue
        seen.add(code)
        free = set().union(*[sympy.sympify(s).free_symbols for s in sc.strides])
        syms = tuple(sorted((text_names[s], code_names[s]) for s in free if s in code_names))
        out.append(ShapeCheck(code, f"{sc.source.name()}.stride() == {tup_text}",
                              ((f"{sc.source.name()}.stride()",
                                f"tuple({sc.source.guard_expr()}.stride())"), *syms)))
    return out


__all__ = [
    "KilnShapeEnv",
    "NeedsShapeEnv",
    "ShapeCheck",
    "ShapeState",
    "SymNodeVariable",
    "dynamic_dims_for",
    "has_symnode",
    "is_symbolic",
    "make_dynamic_input",
    "mark_dynamic",
    "mark_static",
    "prune_unused_size_nodes",
    "scalar_of_tensor",
    "shape_checks",
    "sym_operator",
    "tensor_size",
    "wrap_symbolic",
]
