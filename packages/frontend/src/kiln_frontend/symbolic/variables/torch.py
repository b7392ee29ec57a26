"""``torch.*`` functions (graph nodes) and Python modules (``torch``, ``torch.nn.functional``,
the user's own modules)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import Guard, GuardKind
from ...sources import AttrSource, Source, guard_constant
from .base import KnownCallableVariable, NotConstant, VariableTracker, tracker_for
from .constant import wrap_constant_result

#: modules whose public functions become single call_function nodes
_GRAPH_MODULES = frozenset({
    "torch", "torch.functional", "torch.nn.functional", "torch.fft", "torch.linalg",
    "torch.special", "torch._C._VariableFunctions", "torch._C._nn", "torch._C._fft",
    "torch._C._linalg", "torch._C._special", "torch.nn.init", "torch._refs",
    "torch._tensor", "torch.random",
})

#: torch functions that change global state or leave torch: never called while tracing
_BLOCKED = frozenset({
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "save", "load",
    "compile", "set_grad_enabled", "set_default_dtype", "set_default_device",
    "set_default_tensor_type", "set_num_threads", "set_printoptions",
    "use_deterministic_algorithms", "set_float32_matmul_precision", "synchronize",
    "set_anomaly_enabled",
})

#: torch functions that return a Python value fixed by the guards: folded to constants
_FOLDABLE: set[Any] = {
    torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel,
    torch.get_default_dtype, torch.promote_types, torch.result_type, torch.finfo, torch.iinfo,
    torch.broadcast_shapes, torch.is_storage, torch.can_cast,
    torch.is_grad_enabled,  # fixed by the GRAD_MODE guard
}


def is_member(value: Any, table: Any) -> bool:
    """Is ``value`` itself (by identity) a key of ``table``? Never runs the value's own
    ``__hash__``/``__eq__``: the builder asks this of every object it meets, user objects
    included, and a user's ``__hash__`` may read fields an object under construction does not
    have yet (a frozen dataclass that caches its hash in ``__post_init__``, as DTensorSpec
    does), or have side effects."""
    key = _identity_index(table).get(id(value), _MISSING)
    return key is value


_MISSING = object()


_identity_indexes: dict[int, tuple[Any, int, dict[int, Any]]] = {}


def _identity_index(table: Any) -> dict[int, Any]:
    hit = _identity_indexes.get(id(table))
    if hit is None or hit[0] is not table or hit[1] != len(table):
        hit = (table, len(table), {id(k): k for k in table})
        _identity_indexes[id(table)] = hit
    return hit[2]


def _is_foldable(value: Any) -> bool:
    if is_member(value, _FOLDABLE):
        return True
    from ...trace_rules import Rule, lookup

    decision = lookup(value)
    return decision is not None and decision.rule is Rule.CONSTANT


#: namespaces of torch's generated bindings of ATen operators (private ones included, e.g.
#: ``torch._native_batch_norm_legit``): every function there is one kernel
_ATEN_BINDINGS = (torch._C._VariableFunctions, torch._C._nn, torch._C._fft, torch._C._linalg,
                  torch._C._special)


def _is_aten_binding(value: Any) -> bool:
    name = getattr(value, "__name__", "")
    if name == "_print" or name.startswith("_cufft"):  # I/O and a global cache setting
        return False
    return any(getattr(ns, name, None) is value for ns in _ATEN_BINDINGS)


def is_torch_callable(value: Any) -> bool:
    """True for functions that go into the graph as one call_function node."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if isinstance(value, torch._library.custom_ops.CustomOpDef):  # @torch.library.custom_op
        return True
    if _is_foldable(value):
        return True
    if getattr(value, "_torchdynamo_orig_callable", None) is not None:
        # the wrapper torch's own compiler made (functools.wraps gives it the wrapped
        # function's name and module, torch.nn.functional's when F.gelu was compiled): it
        # runs as torch compiled it, a graph break, never a node of kiln's graph
        return False
    from ...trace_rules import Rule, lookup

    decision = lookup(value)
    if decision is not None and decision.rule is Rule.GRAPH:
        return True
    if decision is not None and decision.rule is Rule.INLINE and \
            isinstance(value, types.FunctionType):
        return False
    module = getattr(value, "__module__", None) or ""
    name = getattr(value, "__name__", "")
    if isinstance(value, types.BuiltinFunctionType) and _is_aten_binding(value):
        return True
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType)):
        if module in _GRAPH_MODULES or (module == "torch._C" and hasattr(torch, name)):
            return not name.startswith("_") or name in ("__and__", "__or__", "__xor__")
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(value, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase)
    return False


class TorchFunctionVariable(KnownCallableVariable):
    """A torch function: calling it on trackers adds a ``call_function`` node."""

    @classmethod
    def wrap(cls, builder, value):
        # ``torch`` itself is guarded; a torch function bound to a user global is guarded
        if builder.source is not None:
            builder.install_identity_guard(value, what="function")
        if isinstance(value, torch._library.custom_ops.CustomOpDef):
            value = value._opoverload  # what calling it runs; FX names a target by __name__
        return cls(value, source=builder.source)

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        from .ctx_managers import GLOBAL_STATE_CALLS

        state_call = GLOBAL_STATE_CALLS.get(fn)
        if state_call is not None:
            return state_call(tx, list(args), dict(kwargs))
        if self.name in _BLOCKED:
            raise Unsupported(f"call to torch.{self.name} (global state)")
        if _is_foldable(fn):
            from .tensor import TensorVariable

            if not any(isinstance(a, TensorVariable) for a in [*args, *kwargs.values()]):
                try:
                    cargs = [a.as_python_constant() for a in args]
                    ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
                except NotConstant:
                    raise Unsupported(f"torch.{self.name} with non-constant arguments") from None
                return wrap_constant_result(fn(*cargs, **ckwargs), what=f"torch.{self.name}")
            return tx.output.create_graph_op("call_function", fn, args, kwargs,
                                             allow_constant_result=True)
        if fn in (torch.from_numpy, torch.as_tensor, torch.tensor):
            from .numpy_arrays import tensor_from_array

            tensor = tensor_from_array(tx, fn, list(args), dict(kwargs))
            if tensor is not None:
                return tensor
        variant = SYMBOLIC_VARIANTS.get(fn)
        if variant is not None and _holds_symbol(args):
            fn = variant
        return tx.output.create_graph_op("call_function", fn, args, kwargs)


#: torch callables whose fake-tensor run specializes a SymInt argument (``torch.tensor(n)``
#: reads ``int(n)``, a guard that recompiles per value), and the variant that keeps it
#: symbolic in the graph (what torch.compile calls there too)
SYMBOLIC_VARIANTS: dict[Any, Any] = {torch.tensor: torch._refs.tensor}


def _holds_symbol(args) -> bool:
    from ...shapes import SymNodeVariable

    def holds(a):
        if isinstance(a, SymNodeVariable):
            return True
        items = getattr(a, "items", None)
        return isinstance(items, list) and any(holds(i) for i in items)

    return any(holds(a) for a in args)


@tracker_for(types.ModuleType)
class PythonModuleVariable(VariableTracker):
    """A Python module (``torch``, ``torch.nn.functional``, ``math``, a user module).

    A module reached as a global of the frame is guarded with FUNCTION_MATCH (its identity),
    as TorchDynamo does for ``torch``."""

    def __init__(self, module: types.ModuleType, *, source=None):
        super().__init__(source=source)
        self.module = module

    @classmethod
    def wrap(cls, builder, value):
        if builder.source is not None:  # (torch's submodules are read unguarded)
            builder.install_guard(GuardKind.FUNCTION_MATCH, id(value), what="module")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.module

    def python_type(self) -> type:
        return types.ModuleType

    def var_getattr(self, tx, name: str) -> VariableTracker:
        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise Unsupported(f"module {self.module.__name__!r} has no attribute {name!r}") \
                from None
        src = AttrSource(self.source, name) if self.source is not None else None
        return tx.wrap_value(value, src)

    def describe(self) -> str:
        return f"PythonModuleVariable({self.module.__name__})"

    def reconstruct(self, codegen):
        self.reload_or_load(codegen, self.module)


# -- torch's own Python helpers that models call: folded or handled, never inlined ---------


def _fold_to(value: Any):
    def handler(tx, args, kwargs):
        return wrap_constant_result(value, what="torch helper")

    return handler


def _torch_assert(tx, args, kwargs):
    from .tensor import TensorVariable

    cond = args[0] if args else kwargs.get("condition")
    if cond is None or isinstance(cond, TensorVariable):
        raise Unsupported("torch._assert on a tensor (data-dependent)")
    if cond.truth_value(tx):
        return wrap_constant_result(None, what="torch._assert")
    raise Unsupported("torch._assert fails while tracing")


@dataclasses.dataclass(frozen=True)
class TorchStateSource(Source):
    """The value of a no-argument state query (``torch.is_autocast_enabled()``,
    ``sys.exc_info()``): a folded query is guarded with CONSTANT_MATCH on it, so a change
    recompiles."""

    module: str
    query: str
    scope = "global"

    def name(self) -> str:
        return f"{self.module}.{self.query}()"

    def short_name(self) -> str:
        return self.name()

    def guard_expr(self) -> str:
        # (the module bound once in check functions' scope: ``__import__(m, fromlist=['_'])``
        # looked for a submodule ``m._`` on disk at every check)
        module = sys.modules.get(self.module) or importlib.import_module(self.module)
        return f"{guard_constant(module, f'module_{self.module}')}.{self.query}()"

    def reconstruct(self, codegen: Any) -> None:
        raise Unsupported(f"cannot rebuild {self.name()} in generated code")


def _fold_state_query(fn: Any, *, allowed: Any = None):
    """``fn()`` folded to its value now, guarded by a TorchStateSource; ``allowed(value)``
    says whether the value can be folded at all (else a graph break)."""
    source = TorchStateSource(fn.__module__ if fn.__module__ != "torch._C._VariableFunctions"
                              else "torch", fn.__name__)

    def handler(tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{source.name()} with arguments")
        value = fn()
        if allowed is not None and not allowed(value):
            raise Unsupported(f"{source.name()} returned {value!r}")
        tx.output.guards.add(Guard(source, GuardKind.CONSTANT_MATCH, value, "torch state"))
        return wrap_constant_result(value, what=source.name())

    return handler


def _has_torch_function(tx, args, kwargs):
    """``torch.overrides.has_torch_function*(...)``: False when every tensor among the
    arguments is a plain ``Tensor``/``Parameter`` (their classes are guarded by
    TENSOR_MATCH) and no torch-function mode is active (checked while tracing)."""
    from .tensor import TensorVariable, plain_tensor_class

    if kwargs:
        raise Unsupported("has_torch_function with keyword arguments")
    if torch._C._is_torch_function_mode_enabled():
        raise Unsupported("has_torch_function under an active torch-function mode")
    items = list(args)
    if len(items) == 1 and items[0].has_unpack_var_sequence(tx) and \
            not isinstance(items[0], TensorVariable):
        items = items[0].unpack_var_sequence(tx)
    for item in items:
        item = tx.realize(item)
        if isinstance(item, TensorVariable):
            if not plain_tensor_class(item.python_type()):
                raise Unsupported("has_torch_function on a tensor subclass")
        elif not item.is_python_constant():
            raise Unsupported(f"has_torch_function on {item.describe()}")
    return wrap_constant_result(False, what="has_torch_function")


def _special_functions() -> dict[Any, Any]:
    table: dict[Any, Any] = {torch._assert: _torch_assert}
    for fn in (torch._C._has_torch_function, torch._C._has_torch_function_unary,
               torch._C._has_torch_function_variadic):
        table[fn] = _has_torch_function
    table[torch.is_autocast_enabled] = _fold_state_query(torch.is_autocast_enabled)
    from torch.nn.utils import stateless

    from .functional_call import functional_call

    table[torch.func.functional_call] = functional_call
    table[stateless.functional_call] = functional_call
    from torch.utils import _python_dispatch

    # torch's attention modules ask whether make_fx is tracing: no dispatch mode while we
    # trace, and the guard recompiles (or breaks) if one is active at run time
    table[_python_dispatch._get_current_dispatch_mode_stack] = _fold_state_query(
        _python_dispatch._get_current_dispatch_mode_stack, allowed=lambda stack: not stack)
    for owner, name, value in [
        (torch.jit, "is_scripting", False), (torch.jit, "is_tracing", False),
        (torch._C, "_get_tracing_state", None), (torch.cuda, "is_available", None),
        # libraries take their compiler-friendly path when these say True (transformers'
        # CompileableContextVar, ...): we are such a compiler while tracing
        (torch.compiler, "is_compiling", True), (torch.compiler, "is_dynamo_compiling", True),
        (torch.compiler, "is_exporting", False),
        # nn.TransformerEncoderLayer / nn.MultiheadAttention trace their math (which the
        # backend compiles), not their fused native kernel (which it can only call): as a
        # backend tracing the module at the ATen level sees them
        (torch.backends.mha, "get_fastpath_enabled", False),
    ]:
        fn = getattr(owner, name, None)
        if fn is not None:
            table[fn] = _fold_to(fn() if value is None else value)
    return table


#: python function of torch -> handler(tx, args, kwargs) -> tracker
TORCH_SPECIAL_FUNCTIONS: dict[Any, Any] = _special_functions()


class TorchSpecialFunctionVariable(KnownCallableVariable):
    """A torch helper written in Python with a fixed meaning while tracing
    (``torch._assert``, ``torch.jit.is_scripting``...)."""

    def call_function(self, tx, args, kwargs):
        return TORCH_SPECIAL_FUNCTIONS[self.fn](tx, args, kwargs)

    def describe(self) -> str:
        return f"TorchSpecialFunctionVariable({getattr(self.fn, '__qualname__', self.fn)})"
