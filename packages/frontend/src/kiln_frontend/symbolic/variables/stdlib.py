"""Standard-library callables traced by what they mean (issue 10): ``functools.reduce``,
``math.*`` on Python numbers, ``dict.fromkeys``, building ``collections.OrderedDict`` /
``defaultdict``, ``@contextlib.contextmanager`` objects, and building a parameter-free
``torch.nn`` module inside the frame.

Two tables, each refusing duplicates: ``BUILTIN_HANDLERS`` (a C callable -> handler, merged
into the builtins of ``builtins.py``) and ``CLASS_CONSTRUCTORS`` (a class -> what calling
it builds, consulted by ``UserDefinedClassVariable``).  A handler returns a tracker, or
None when the call is not one it knows (the caller then graph-breaks with the name)."""

from __future__ import annotations

import _heapq
import collections
import contextlib
import functools
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ...exc import Unsupported
from ...layers import upper
from .base import KnownCallableVariable, NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable, wrap_constant_result
from .containers import ConstDictVariable, ListVariable, load_key

Handler = Callable[..., VariableTracker | None]

#: C callable -> handler(tx, args, kwargs)
BUILTIN_HANDLERS: dict[Any, Handler] = {}
#: class -> constructor(tx, cls, args, kwargs)
CLASS_CONSTRUCTORS: dict[type, Handler] = {}


def register_builtin(fn: Any, handler: Handler) -> None:
    if fn in BUILTIN_HANDLERS:
        raise ValueError(f"builtin handler for {fn!r} already registered")
    BUILTIN_HANDLERS[fn] = handler


def register_constructor(cls: type, handler: Handler) -> None:
    if cls in CLASS_CONSTRUCTORS:
        raise ValueError(f"constructor for {cls.__qualname__} already registered")
    CLASS_CONSTRUCTORS[cls] = handler


@upper.provide
def constructor_for(cls: type) -> Handler | None:
    """What calling ``cls`` builds while tracing, or None."""
    hit = CLASS_CONSTRUCTORS.get(cls)
    if hit is not None:
        return hit
    from .exceptions import ExceptionVariable, is_traced_exception_class

    if is_traced_exception_class(cls):
        return ExceptionVariable.construct
    from .numpy_values import construct_numpy_scalar, is_numpy_scalar_class

    if is_numpy_scalar_class(cls):
        return construct_numpy_scalar
    if _is_stateless_torch_module(cls):
        return _construct_torch_module
    return None


def _constants(args, kwargs, what: str):
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except NotConstant:
        raise Unsupported(f"{what} with non-constant arguments") from None


# -- math.* on Python numbers -----------------------------------------------------------------

#: pure functions of ``math``: folded when every argument is a constant
MATH_FUNCTIONS = tuple(
    getattr(math, name) for name in (
        "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "comb",
        "copysign", "cos", "cosh", "degrees", "dist", "erf", "erfc", "exp2", "expm1",
        "fabs", "factorial", "fmod", "frexp", "fsum", "gamma", "gcd", "hypot", "isfinite",
        "isinf", "isnan", "isqrt", "lcm", "ldexp", "lgamma", "log10", "log1p", "log2",
        "modf", "nextafter", "perm", "pow", "radians", "remainder", "sin", "sinh", "tan",
        "tanh", "trunc", "ulp",
    ) if hasattr(math, name))


def _fold_math(fn):
    sym_fn = getattr(torch, f"_sym_{fn.__name__}", None)

    def handler(tx, args, kwargs):
        if sym_fn is not None and len(args) == 1 and not kwargs and \
                type(tx.realize(args[0])).__name__ == "SymNodeVariable":
            # math.sqrt(n) on a dynamic int stays symbolic (a torch._sym_sqrt node), as in
            # torch.compile, rather than specializing n
            from ...shapes import wrap_symbolic

            arg = tx.realize(args[0])
            return wrap_symbolic(tx.output, lambda: tx.output.tracer.create_proxy(
                "call_function", sym_fn, (arg.as_proxy(),), {}), sym_fn(arg.as_example()))
        cargs, ckwargs = _constants(args, kwargs, f"math.{fn.__name__}")
        try:
            result = fn(*cargs, **ckwargs)
        except (ValueError, TypeError, OverflowError) as e:
            from .raising import raise_traced_from

            raise_traced_from(e, f"math.{fn.__name__}")
        return wrap_constant_result(result, what=f"math.{fn.__name__}")

    return handler


for _fn in MATH_FUNCTIONS:
    register_builtin(_fn, _fold_math(_fn))
register_builtin(math.sqrt, _fold_math(math.sqrt))  # (also symbolic: torch._sym_sqrt)
del _fn


def _intern(tx, args, kwargs):
    """``sys.intern(s)`` of a constant string (``collections.namedtuple`` interns its
    names): the interned string, as eager's."""
    if len(args) != 1 or kwargs:
        return None
    arg = tx.realize(args[0])
    if not (arg.is_python_constant() and type(arg.as_python_constant()) is str):
        return None
    return ConstantVariable(sys.intern(arg.as_python_constant()))


register_builtin(sys.intern, _intern)


# -- functools.reduce ---------------------------------------------------------------------------

_NO_INITIAL = object()


def _reduce(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    fn, items = args[0], [tx.realize(it) for it in tx.unpack_sequence(args[1])]
    acc = args[2] if len(args) == 3 else _NO_INITIAL
    if acc is _NO_INITIAL:
        if not items:
            raise Unsupported("functools.reduce() of an empty sequence with no initial value")
        acc, items = items[0], items[1:]
    for it in items:
        acc = tx.realize(tx.call_function(fn, [acc, it], {}))
    return acc


register_builtin(functools.reduce, _reduce)


# -- dicts --------------------------------------------------------------------------------------

def _dict_fromkeys(dict_cls):
    def handler(tx, args, kwargs):
        if kwargs or len(args) not in (1, 2):
            return None
        value = args[1] if len(args) == 2 else ConstantVariable(None)
        keys = []
        for k in tx.unpack_sequence(args[0]):
            try:
                keys.append(tx.realize(k).as_python_constant())
            except NotConstant:
                raise Unsupported("dict.fromkeys with a non-constant key") from None
        return ConstDictVariable(dict.fromkeys(keys, value), dict_cls=dict_cls)

    return handler


def _heap_operation(fn: Callable) -> Handler:
    """A ``_heapq`` C function on a list of constants (``Counter.most_common`` runs
    ``heapq.nlargest``): run for real on the values, the list's items rearranged as it
    left them (a list from the frame is written back after the graph)."""

    def handler(tx, args, kwargs):
        from .constant import is_constant_value

        if kwargs or not args or not isinstance(tx.realize(args[0]), ListVariable):
            return None
        heap = tx.realize(args[0])
        try:
            values = [tx.realize(v).as_python_constant() for v in heap.items]
            rest = [tx.realize(a).as_python_constant() for a in args[1:]]
        except NotConstant:
            raise Unsupported(f"heapq.{fn.__name__} on a list of non-constants") from None
        if not all(is_constant_value(v) for v in [*values, *rest]):
            raise Unsupported(f"heapq.{fn.__name__} on mutable items")
        heap.check_mutable(f"heapq.{fn.__name__}")
        try:
            result = fn(values, *rest)
        except (IndexError, TypeError) as e:  # an empty heap, items that do not compare
            raise Unsupported(f"heapq.{fn.__name__} raised {type(e).__name__}: {e}") from None
        heap.items[:] = [ConstantVariable.create(v) for v in values]
        return wrap_constant_result(result, what=f"heapq.{fn.__name__}")

    return handler


for _name in ("heapify", "heappush", "heappop", "heapreplace", "heappushpop",
              "_heapify_max", "_heapreplace_max", "_heappop_max"):
    _heap_fn = getattr(_heapq, _name, None)
    if _heap_fn is not None:
        register_builtin(_heap_fn, _heap_operation(_heap_fn))

register_builtin(dict.fromkeys, _dict_fromkeys(dict))
register_builtin(collections.OrderedDict.fromkeys, _dict_fromkeys(collections.OrderedDict))


def _ordered_dict(tx, cls, args, kwargs):
    plain = upper.BuiltinVariable(dict).call_function(tx, args, kwargs)
    if not isinstance(plain, ConstDictVariable):
        return None
    return ConstDictVariable(plain.items, dict_cls=cls)


register_constructor(collections.OrderedDict, _ordered_dict)


def _bound_method(tx, cls, args, kwargs):
    """``types.MethodType(fn, obj)`` (``contextlib.ExitStack`` binds each manager's
    ``__exit__`` so): ``fn`` bound to ``obj``'s tracker, as ``obj.fn`` would be."""
    from .deepcopy import HandledFunctionVariable, HandledMethodVariable
    from .functions import UserFunctionVariable, UserMethodVariable

    if kwargs or len(args) != 2:
        return None
    fn = tx.realize(args[0])
    if type(fn) is HandledFunctionVariable:
        return HandledMethodVariable(fn, tx.realize(args[1]))
    if type(fn) is not UserFunctionVariable or not isinstance(fn.fn, types.FunctionType):
        return None
    return UserMethodVariable(fn.fn, tx.realize(args[1]))


register_constructor(types.MethodType, _bound_method)


def _counter(tx, cls, args, kwargs):
    """``Counter(constants)``: counted at trace time; a dict tracker of class Counter, whose
    Python methods (``most_common``...) are inlined."""
    if cls is not collections.Counter:
        return None
    cargs, ckwargs = _constants(args, kwargs, "collections.Counter")
    real = collections.Counter(*cargs, **ckwargs)
    return ConstDictVariable({k: ConstantVariable.create(v) for k, v in real.items()},
                             dict_cls=collections.Counter)


register_constructor(collections.Counter, _counter)


def _new_object(tx, args, kwargs):
    """``object()``: a fresh sentinel (``heapq.nlargest``, ``dict.pop`` defaults)."""
    if args or kwargs:
        return None
    from .misc import FrameObjectVariable

    return FrameObjectVariable(object)


register_builtin(object, _new_object)


class DefaultDictVariable(ConstDictVariable):
    """A ``collections.defaultdict`` built in the frame: a missing key calls the factory."""

    def __init__(self, items, factory: VariableTracker, **kwargs):
        super().__init__(items, dict_cls=collections.defaultdict, **kwargs)
        self.factory = factory

    def children(self):
        return [*super().children(), self.factory]

    def getitem(self, tx, key):
        try:
            k = tx.realize(key).as_python_constant()
        except NotConstant:
            raise Unsupported("defaultdict key is not a constant") from None
        if k not in self.items:
            self.check_mutable("defaultdict item")
            self.items[k] = tx.realize(tx.call_function(self.factory, [], {}))
        return self.items[k]

    def as_python_constant(self):
        raise NotConstant

    def reconstruct(self, codegen):
        # defaultdict(factory, {k: v, ...})
        codegen.push_null()
        codegen.load_const_object(collections.defaultdict)
        codegen(self.factory)
        for k, v in self.items.items():
            load_key(codegen, k)
            codegen(v)
        codegen.build_map(len(self.items))
        codegen.call_function(2)

    def describe(self) -> str:
        return f"DefaultDictVariable(keys={list(self.items)!r})"


def _default_dict(tx, cls, args, kwargs):
    if kwargs or len(args) > 2 or cls is not collections.defaultdict:
        return None
    factory = args[0] if args else ConstantVariable(None)
    if factory.is_python_constant() and factory.as_python_constant() is None:
        return None  # a defaultdict without a factory is a dict; rare: break
    items = {}
    if len(args) == 2:
        plain = upper.BuiltinVariable(dict).call_function(tx, [args[1]], {})
        items = plain.items
    return DefaultDictVariable(items, factory)


register_constructor(collections.defaultdict, _default_dict)


def _generator_context_manager(tx, cls, args, kwargs):
    from .generator_ctx import GeneratorContextVariable

    return GeneratorContextVariable.construct(tx, cls, args, kwargs)


register_constructor(contextlib._GeneratorContextManager, _generator_context_manager)


# -- torch.nn modules built in the frame --------------------------------------------------------

def _is_stateless_torch_module(cls: type) -> bool:
    """A ``torch.nn`` module class whose instances hold no tensors when built from
    constants (``nn.Softmax(dim)``, ``nn.ReLU()``, ``nn.Flatten()``...): checked on the built
    instance too."""
    from ...trace_rules import torch_module_of_file

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return False
    init = getattr(cls, "__init__", None)
    code = getattr(init, "__code__", None)
    return isinstance(code, types.CodeType) and \
        (torch_module_of_file(code.co_filename) or "").startswith("torch.nn.modules")


def _construct_torch_module(tx, cls, args, kwargs):
    cargs, ckwargs = _constants(args, kwargs, f"{cls.__qualname__}()")
    try:
        module = cls(*cargs, **ckwargs)
    except Exception as e:  # noqa: BLE001 - what the constructor raises is a break reason
        raise Unsupported(f"{cls.__qualname__}() raised {type(e).__name__}: {e}") from None
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        # eager would build fresh (random) tensors on every call
        raise Unsupported(f"building {cls.__qualname__} inside the frame (it holds tensors)")
    return tx.wrap_value(module, tx.output.pinned_source(module))


# -- functools.lru_cache / functools.cache wrappers ---------------------------------------------

@tracker_for(functools._lru_cache_wrapper)
class LruCacheFunctionVariable(KnownCallableVariable):
    """A function wrapped by ``functools.lru_cache``/``cache`` (library predicates such as
    transformers' ``is_torch_distributed_available()``).  On constant arguments it is called
    while tracing and a constant result is folded: its cache fixes the value eager would get
    from then on.  Otherwise ``__wrapped__`` is inlined (the cache is bypassed, as
    TorchDynamo does)."""

    @classmethod
    def wrap(cls, builder, value):
        from ...guards import GuardKind

        if builder.source is not None:
            builder.install_guard(GuardKind.FUNCTION_MATCH, id(value), what="lru_cache function")
        return cls(value, source=builder.source)

    def call_function(self, tx, args, kwargs):
        from .constant import is_constant_value

        try:
            cargs, ckwargs = _constants(args, kwargs, "lru_cache function")
        except Unsupported:
            cargs = None
        if cargs is not None:
            try:
                result = self.fn(*cargs, **ckwargs)
            except Exception as e:  # noqa: BLE001 - a break reason
                raise Unsupported(f"{self.describe()} raised {type(e).__name__}: {e}") \
                    from None
            if is_constant_value(result):
                return ConstantVariable.create(result)
        from ...sources import AttrSource

        base = self.source if self.source is not None else tx.output.pinned_source(self.fn)
        inner = tx.wrap_value(self.fn.__wrapped__, AttrSource(base, "__wrapped__"))
        return tx.call_function(inner, list(args), dict(kwargs))

    def describe(self) -> str:
        return f"LruCacheFunctionVariable({getattr(self.fn, '__qualname__', '?')})"
