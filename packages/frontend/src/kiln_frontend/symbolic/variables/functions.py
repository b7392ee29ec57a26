"""User functions (inlined), methods, functions made while tracing, and builtins."""

from __future__ import annotations

import functools
import inspect
import math
import operator
import types
from typing import Any

import torch

from ...bytecode import versions
from ...exc import Unsupported
from ...guards import Guard, GuardKind
from .base import NotConstant, VariableTracker, tracker_for
from .constant import (
    BINARY_OPERATORS,
    COMPARE_OPERATORS,
    ConstantVariable,
    wrap_constant_result,
)

#: code flags of functions that are not inlined (plain generators are: run to the end)
_GEN_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def check_inlinable(fn: types.FunctionType) -> None:
    """Python code inside torch (context managers, hooks, utilities) is not inlined: a call
    to it is a graph break in the user's frame.  ``kiln_frontend.trace_rules`` decides per
    function and per torch module (the methods of ``torch.nn.modules`` and a few helpers
    that models call are inlined)."""
    from ...trace_rules import Rule, lookup

    decision = lookup(fn)
    if decision is not None and decision.rule is not Rule.INLINE:
        raise Unsupported(f"call to {fn.__module__}.{fn.__qualname__} ({decision.why})")


@tracker_for(types.FunctionType)
class UserFunctionVariable(VariableTracker):
    """A Python function from the user's code: calling it inlines its bytecode."""

    def __init__(self, fn: types.FunctionType, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    @classmethod
    def wrap(cls, builder, value):
        from .torch import TorchFunctionVariable, is_torch_callable

        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(builder, value)
        if value.__closure__ is not None and builder.source is not None:
            # A nested def is a new function object on every call of its parent: match its
            # code instead. Its cells and defaults are guarded where they are read.
            from ...sources import AttrSource

            builder.child(AttrSource(builder.source, "__code__")).install_guard(
                GuardKind.ID_MATCH, id(value.__code__), what="code of a closure"
            )
        else:
            builder.install_guard(GuardKind.FUNCTION_MATCH, id(value), what="function")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return types.FunctionType

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from ...sources import AttrSource

        if name in ("__code__", "__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable.create(getattr(self.fn, name))
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise Unsupported(f"function {self.fn.__qualname__} has no attribute {name!r}") \
                from None
        src = AttrSource(self.source, name) if self.source is not None else None
        return tx.wrap_value(value, src)

    def has_attr(self, tx, name: str) -> bool:
        return hasattr(self.fn, name)

    # inlining interface
    def get_code(self) -> types.CodeType:
        return self.fn.__code__

    def get_globals(self) -> dict:
        return self.fn.__globals__

    def get_name(self) -> str:
        return self.fn.__qualname__

    def function_source(self, tx):
        """Where the function object itself is reloaded from, for guards on its defaults and
        cells: its source, else the object pinned as a global (see
        ``OutputGraph.pinned_source``).  Never None: a default or a cell read without a
        guard would be baked into the compiled code."""
        return self.source if self.source is not None else tx.output.pinned_source(self.fn)

    def get_defaults(self, tx) -> tuple[list[VariableTracker], dict[str, VariableTracker]]:
        from ...sources import defaults_source, kwdefaults_source

        fn_src = self.function_source(tx)
        defaults = [tx.wrap_value(d, defaults_source(fn_src, i))
                    for i, d in enumerate(self.fn.__defaults__ or ())]
        kwdefaults = {k: tx.wrap_value(d, kwdefaults_source(fn_src, k))
                      for k, d in (self.fn.__kwdefaults__ or {}).items()}
        return defaults, kwdefaults

    def get_closure_cells(self, tx) -> dict[str, Any]:
        from ...sources import cell_contents_source
        from .misc import ClosureCellVariable

        fn_src = self.function_source(tx)
        return {name: ClosureCellVariable(self.fn.__closure__[i],
                                          cell_contents_source(fn_src, i))
                for i, name in enumerate(self.fn.__code__.co_freevars)}

    def call_function(self, tx, args, kwargs):
        from .ctx_managers import decorated_context_call

        if self.fn.__code__.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling coroutine function {self.fn.__qualname__}")
        if self.fn in TRACE_TIME_FUNCTIONS:
            folded = call_at_trace_time(tx, self.fn, args, kwargs)
            if folded is not None:
                return folded
        result = decorated_context_call(tx, self.fn, self.source, args, kwargs)
        if result is not None:
            return result
        check_inlinable(self.fn)
        return tx.inline_call(self, args, kwargs)

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen.load_const_object(self.fn)

    def describe(self) -> str:
        return f"UserFunctionVariable({self.fn.__qualname__})"


def method_of_class(tx, fn: types.FunctionType, obj: VariableTracker, source) -> VariableTracker:
    """``obj.<name>`` found on ``obj``'s class: the bound method, with an ID_MATCH guard on
    ``<source>.__func__``, so that replacing the method on the class, or shadowing it with an
    instance attribute (a monkeypatched ``forward``), recompiles."""
    from ...guards import Guard
    from ...sources import AttrSource

    if source is not None:
        tx.output.guards.add(Guard(AttrSource(source, "__func__"), GuardKind.ID_MATCH,
                                   id(fn), "method"))
    return UserMethodVariable(fn, obj, source=source)


def method_of_pinned_class(tx, cls: type, name: str, fn: types.FunctionType,
                           obj: VariableTracker) -> VariableTracker:
    """``obj.<name>`` found on ``cls`` for an object without a source (made in the frame): the
    class is pinned (``OutputGraph.pinned_source``) and ``cls.<name>`` guarded by ID_MATCH,
    so replacing the method on the class recompiles."""
    guard_class_member(tx, cls, name, fn)
    return UserMethodVariable(fn, obj)


def guard_class_member(tx, cls: type, name: str, member: Any) -> None:
    """ID_MATCH on ``cls.<name>`` (the class pinned as a global): a method, ``__init__`` or
    property getter that the frame inlined must still be the class's."""
    from ...guards import Guard
    from ...sources import AttrSource

    src = AttrSource(tx.output.pinned_source(cls), name)
    tx.output.guards.add(Guard(src, GuardKind.ID_MATCH, id(member), "class member"))


def call_property(tx, cls: type, name: str, prop: property, obj: VariableTracker):
    """``obj.<name>`` for a Python property of ``cls``: its getter inlined (guarded)."""
    guard_class_member(tx, cls, name, prop)
    return UserFunctionVariable(prop.fget).call_function(tx, [obj], {})


class UserMethodVariable(UserFunctionVariable):
    """A function bound to an object tracker (``self.helper`` on a module or object)."""

    def __init__(self, fn: types.FunctionType, obj: VariableTracker, *, source=None):
        super().__init__(fn, source=source)
        self.obj = obj

    def children(self):
        return [self.obj]

    def call_function(self, tx, args, kwargs):
        from .ctx_managers import decorated_context_call

        if self.fn.__code__.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling coroutine method {self.fn.__qualname__}")
        result = decorated_context_call(tx, self.fn, None, [self.obj, *args], kwargs)
        if result is not None:
            return result
        from .misc import ABC_MIXIN_OVERRIDES

        override = ABC_MIXIN_OVERRIDES.get(self.fn)
        if override is not None and hasattr(self.obj, "unpack_var_sequence"):
            return override(tx, self.obj, *args, **kwargs)
        check_inlinable(self.fn)
        return tx.inline_call(self, [self.obj, *args], kwargs)

    def function_source(self, tx):
        # defaults and cells belong to the function, reached as ``<method>.__func__``
        from ...sources import AttrSource

        if self.source is not None:
            return AttrSource(self.source, "__func__")
        return tx.output.pinned_source(self.fn)

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        # types.MethodType(fn, obj): ``obj.<name>`` could find an override (super())
        codegen.push_null()
        codegen.load_const_object(types.MethodType)
        codegen.load_const_object(self.fn)
        codegen(self.obj)
        codegen.call_function(2)

    def describe(self) -> str:
        return f"UserMethodVariable({self.fn.__qualname__})"


class NestedUserFunctionVariable(VariableTracker):
    """A function created by MAKE_FUNCTION while tracing (comprehensions on 3.11, lambdas,
    inner functions).  Its closure cells point at the creating translator's locals."""

    def __init__(self, code: types.CodeType, f_globals: dict, qualname: str,
                 defaults: list[VariableTracker], kwdefaults: dict[str, VariableTracker],
                 closure: list[VariableTracker]):
        super().__init__()
        self.code = code
        self.f_globals = f_globals
        self.qualname = qualname
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure

    def get_code(self):
        return self.code

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__code__":
            return ConstantVariable(self.code)
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(self.code.co_name if name == "__name__" else self.qualname)
        if name == "__module__":
            return ConstantVariable.create(self.f_globals.get("__name__"))
        raise Unsupported(f"attribute {name!r} of nested function {self.qualname}")

    def python_type(self) -> type:
        return types.FunctionType

    def get_globals(self):
        return self.f_globals

    def get_name(self):
        return self.qualname

    def get_defaults(self, tx):
        return list(self.defaults), dict(self.kwdefaults)

    def get_closure_cells(self, tx):
        return dict(zip(self.code.co_freevars, self.closure, strict=True))

    def call_function(self, tx, args, kwargs):
        if self.code.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling coroutine function {self.qualname}")
        return tx.inline_call(self, args, kwargs)

    def reconstruct(self, codegen):
        # MAKE_FUNCTION again, with the same cells (LOAD_CLOSURE of the frame's own cell
        # and free variables)
        from .misc import LocalCellVariable

        if self.defaults or self.kwdefaults:
            raise Unsupported(f"cannot rebuild function {self.qualname} with defaults")
        names = []
        for cell in self.closure:
            name = getattr(cell, "name", None)
            owner = getattr(cell, "tx", None)
            if isinstance(cell, LocalCellVariable) and owner is not None and owner.parent is None:
                names.append(name)
            elif type(cell).__name__ == "RootFreeVarCell":
                names.append(name)
            else:
                raise Unsupported(f"cannot rebuild function {self.qualname}: its closure "
                                  "is not the frame's")
        if names and not all(n in codegen.cellvars or n in codegen.freevars for n in names):
            raise Unsupported(f"cannot rebuild function {self.qualname}")
        codegen.make_function(self.code, names)

    def describe(self) -> str:
        return f"NestedUserFunctionVariable({self.qualname})"


class SuperVariable(VariableTracker):
    """``super()`` / ``super(cls, obj)``: attribute lookups start after ``cls`` in the MRO of
    ``obj``'s type (or of ``obj`` itself when it is a class, in a classmethod)."""

    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__()
        self.cls = cls
        self.obj = obj

    def children(self):
        return [self.obj]

    def describe(self) -> str:
        return f"SuperVariable({self.cls.__qualname__}, {self.obj.describe()})"

    def _owner_type(self) -> tuple[type, bool]:
        from .misc import UserDefinedClassVariable

        if isinstance(self.obj, UserDefinedClassVariable):
            return self.obj.cls, True
        return self.obj.python_type(), False

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .misc import wrap_class

        owner, is_class = self._owner_type()
        mro = owner.__mro__
        if self.cls not in mro:
            raise Unsupported(f"super({self.cls.__qualname__}, obj): obj is not an instance")
        for klass in mro[mro.index(self.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                break
        else:
            raise Unsupported(f"super() has no attribute {name!r}")
        if attr is object.__init__:
            return NoOpVariable("object.__init__")
        if klass.__module__.split(".")[0] != "torch" and \
                isinstance(attr, (types.FunctionType, staticmethod, property)):
            # replacing it on the base class recompiles (torch's own classes are trusted)
            guard_class_member(tx, klass, name, getattr(klass, name)
                               if isinstance(attr, staticmethod) else attr)
        builtin_method = getattr(self.obj, "builtin_method", None)
        if builtin_method is not None and klass.__module__ == "builtins" and \
                isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            return builtin_method(tx, name)
        if isinstance(attr, types.FunctionType):
            if is_class:
                return UserFunctionVariable(attr)
            return UserMethodVariable(attr, self.obj)
        if isinstance(attr, staticmethod):
            return tx.wrap_value(attr.__func__, None)
        if isinstance(attr, classmethod) and isinstance(attr.__func__, types.FunctionType):
            cls_var = self.obj if is_class else wrap_class(owner)
            return UserMethodVariable(attr.__func__, cls_var)
        if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
            return UserFunctionVariable(attr.fget).call_function(tx, [self.obj], {})
        from .constant import is_constant_value

        if is_constant_value(attr):
            return ConstantVariable.create(attr)
        raise Unsupported(f"super().{name} ({type(attr).__name__})")


class NoOpVariable(VariableTracker):
    """A callable known to do nothing and return None (``object.__init__`` via super())."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)

    def describe(self) -> str:
        return f"NoOpVariable({self.name})"


@tracker_for(functools.partial)
class PartialVariable(VariableTracker):
    """``functools.partial(func, *args, **keywords)``: calling it calls ``func`` with the
    stored arguments first (so a partial of a user function is inlined)."""

    def __init__(self, func: VariableTracker, args: list[VariableTracker],
                 keywords: dict[str, VariableTracker], *, source=None):
        super().__init__(source=source)
        self.func = func
        self.args = list(args)
        self.keywords = dict(keywords)

    @classmethod
    def wrap(cls, builder, value):
        from ...sources import AttrSource, GetItemSource

        if type(value) is not functools.partial:
            raise Unsupported(f"partial subclass {type(value).__qualname__}")
        builder.install_guard(GuardKind.TYPE_MATCH, type(value))
        src = builder.source

        def child(attr, key=None):
            if src is None:
                return builder.child(None)
            s = AttrSource(src, attr)
            return builder.child(s if key is None else GetItemSource(s, key))

        func = child("func")(value.func)
        builder.child(AttrSource(src, "args") if src else None).install_guard(
            GuardKind.LIST_LENGTH, (tuple, len(value.args)))
        args = [child("args", i)(a) for i, a in enumerate(value.args)]
        builder.child(AttrSource(src, "keywords") if src else None).install_guard(
            GuardKind.DICT_KEYS, (dict, tuple(value.keywords)))
        keywords = {k: child("keywords", k)(v) for k, v in value.keywords.items()}
        return cls(func, args, keywords, source=src)

    def children(self):
        return [self.func, *self.args, *self.keywords.values()]

    def python_type(self) -> type:
        return functools.partial

    def call_function(self, tx, args, kwargs):
        return tx.call_function(self.func, [*self.args, *args], {**self.keywords, **kwargs})

    def var_getattr(self, tx, name):
        from .containers import ConstDictVariable, TupleVariable

        if name == "func":
            return self.func
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "keywords":
            return ConstDictVariable(dict(self.keywords))
        raise Unsupported(f"attribute {name!r} of functools.partial")

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        # functools.partial(*(func, *args), **keywords)
        codegen.push_null()
        codegen.load_const_object(functools.partial)
        codegen(self.func)
        for a in self.args:
            codegen(a)
        codegen.build_tuple(len(self.args) + 1)
        for k, v in self.keywords.items():
            codegen.load_const(k)
            codegen(v)
        codegen.build_map(len(self.keywords))
        codegen.extend(versions.call_function_ex(True))

    def describe(self) -> str:
        return f"PartialVariable({self.func.describe()})"


class TraceTimeValueVariable(VariableTracker):
    """An immutable object computed at trace time from known values (an
    ``inspect.Signature``, its ``parameters`` mapping...): reads and pure calls run on
    the real object; it counts as a Python constant."""

    def __init__(self, value: Any):
        super().__init__()
        self.value = value

    def as_python_constant(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        try:
            return wrap_trace_value(tx, getattr(self.value, name))
        except AttributeError:
            raise Unsupported(f"{type(self.value).__name__} has no attribute {name!r}") \
                from None

    def call_function(self, tx, args, kwargs):
        if not callable(self.value) or not isinstance(
                self.value, (types.BuiltinMethodType, types.MethodType)):
            raise Unsupported(f"call to {type(self.value).__name__}")
        cargs, ckwargs = _const_args(args, kwargs, f"{self.value!r}")
        return wrap_trace_value(tx, self.value(*cargs, **ckwargs))

    def has_unpack_var_sequence(self, tx) -> bool:
        return hasattr(self.value, "__iter__")

    def unpack_var_sequence(self, tx):
        return [wrap_trace_value(tx, v) for v in self.value]

    def reconstruct(self, codegen):
        codegen.load_const_object(self.value)

    def describe(self) -> str:
        return f"TraceTimeValueVariable({type(self.value).__name__})"


_TRACE_TIME_TYPES = (inspect.Signature, inspect.Parameter, types.MappingProxyType,
                     type(inspect.Parameter.empty))


def wrap_trace_value(tx, value: Any) -> VariableTracker:
    from .constant import is_constant_value

    if is_constant_value(value):
        return ConstantVariable.create(value)
    if isinstance(value, _TRACE_TIME_TYPES) or (
            isinstance(value, (types.BuiltinMethodType, types.MethodType)) and
            isinstance(getattr(value, "__self__", None), _TRACE_TIME_TYPES)):
        return TraceTimeValueVariable(value)
    if isinstance(value, (tuple, list)):
        from .containers import ListVariable, TupleVariable

        items = [wrap_trace_value(tx, v) for v in value]
        return TupleVariable(items) if isinstance(value, tuple) else ListVariable(items)
    return tx.wrap_value(value, None)


def _known_value(v: VariableTracker) -> Any:
    if isinstance(v, UserMethodVariable):
        return types.MethodType(v.fn, _known_value(v.obj))
    if v.is_python_constant():
        return v.as_python_constant()
    obj = _identity(v)
    if obj is None or v.mutable:
        raise NotConstant(v)
    return obj


def call_at_trace_time(tx, fn, args, kwargs) -> VariableTracker | None:
    """Run a pure stdlib helper (``inspect.signature``, ``inspect.unwrap``...) on the
    real values when every argument is known; None when one is not."""
    try:
        cargs = [_known_value(tx.realize(a)) for a in args]
        ckwargs = {k: _known_value(tx.realize(v)) for k, v in kwargs.items()}
    except NotConstant:
        return None
    try:
        result = fn(*cargs, **ckwargs)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"{fn.__qualname__} raised {type(e).__name__}: {e}") from None
    return wrap_trace_value(tx, result)


TRACE_TIME_FUNCTIONS = frozenset({
    inspect.signature, inspect.unwrap, inspect.isfunction, inspect.ismethod, inspect.isclass,
    inspect.ismodule, inspect.isroutine, inspect.iscoroutinefunction,
    inspect.isgeneratorfunction, inspect.getfullargspec, inspect.getmro,
})


def bind_args(code: types.CodeType, name: str, args: list[VariableTracker],
              kwargs: dict[str, VariableTracker], defaults: list[VariableTracker],
              kwdefaults: dict[str, VariableTracker]) -> dict[str, VariableTracker]:
    """Python's argument binding, on trackers: returns local name -> tracker.

    ``inspect.Signature.bind`` does the work on a stand-in function built from ``code``
    whose defaults ARE the default trackers, so every rule (positional-only, keyword-only,
    ``*args``, ``**kwargs``, defaults) is Python's own; a binding error is ``Unsupported``
    (the call then runs in Python and raises the real ``TypeError``)."""
    from .containers import ConstDictVariable, TupleVariable

    nslots = code.co_argcount + code.co_kwonlyargcount
    if not all(n.isidentifier() for n in code.co_varnames[:nslots]):
        # a 3.11 comprehension takes one positional argument named ``.0``
        if kwargs or len(args) != code.co_argcount or code.co_kwonlyargcount or \
                code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
            raise Unsupported(f"{name}(): unexpected arguments")
        return dict(zip(code.co_varnames, args, strict=False))
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    stand_in = types.FunctionType(code, {}, code.co_name, tuple(defaults) or None, closure)
    stand_in.__kwdefaults__ = dict(kwdefaults) or None
    try:
        bound = inspect.signature(stand_in).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"{name}(): {e}") from None
    bound.apply_defaults()
    out: dict[str, VariableTracker] = {}
    for pname, param in bound.signature.parameters.items():
        value = bound.arguments[pname]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            value = TupleVariable(list(value))
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            value = ConstDictVariable(dict(value))
        out[pname] = value
    return out


# --------------------------------------------------------------------------------------
# Builtins and operator functions
# --------------------------------------------------------------------------------------


def _const_args(args, kwargs, what: str):
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except NotConstant:
        raise Unsupported(f"{what} with non-constant arguments") from None


_FOLDABLE_BUILTINS = frozenset({
    abs, all, any, bool, bytes, callable, chr, complex, divmod, float, format, hash, int,
    len, max, min, ord, pow, repr, round, sorted, str, sum, slice, range, tuple, list,
    math.sqrt, math.ceil, math.floor, math.prod, math.log, math.exp, math.isclose,
})

_OPERATOR_FNS = frozenset(
    set(BINARY_OPERATORS.values()) | set(COMPARE_OPERATORS.values()) | {
        operator.neg, operator.pos, operator.invert, operator.not_, operator.abs,
        operator.getitem, operator.contains, operator.is_, operator.is_not, operator.truth,
        operator.index,
    })

#: operators that can become graph nodes when a tensor is involved
#: in-place operator -> the operator it means when its left operand is not a tensor
_OUT_OF_PLACE: dict[Any, Any] = {
    BINARY_OPERATORS[sym + "="]: BINARY_OPERATORS[sym]
    for sym in ("+", "&", "//", "<<", "@", "*", "%", "|", "**", ">>", "-", "/", "^")
}

_TENSOR_OPERATORS = frozenset(
    set(BINARY_OPERATORS.values()) | set(COMPARE_OPERATORS.values()) | {
        operator.neg, operator.pos, operator.invert, operator.abs, operator.getitem,
    })


@tracker_for(types.BuiltinFunctionType)
class BuiltinVariable(VariableTracker):
    """``len``, ``isinstance``, ``range``, ``operator.add``...: folded on constants, turned
    into graph nodes on tensors where that means something, a graph break otherwise."""

    def __init__(self, fn: Any, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    @classmethod
    def wrap(cls, builder, value):
        from .torch import TorchFunctionVariable, is_torch_callable

        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(builder, value)
        if builder.source is not None:  # a global, a module's or an object's attribute
            builder.install_identity_guard(value, what="builtin")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def describe(self) -> str:
        return f"BuiltinVariable({self.name})"

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen.load_const_object(self.fn)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .misc import ObjectSetattrVariable

        if self.fn is object and name == "__setattr__":
            return ObjectSetattrVariable()
        if self.fn is object and name == "__init__":
            return NoOpVariable("object.__init__")
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise Unsupported(f"builtin {self.name} has no attribute {name!r}") from None
        from .constant import is_constant_value

        if is_constant_value(value):
            return ConstantVariable.create(value)
        if isinstance(value, types.BuiltinFunctionType) and is_builtin_callable(value):
            return BuiltinVariable(value)
        raise Unsupported(f"attribute {name!r} of builtin {self.name}")

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is None:
            from .stdlib import BUILTIN_HANDLERS as stdlib_handlers

            handler = stdlib_handlers.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in _OPERATOR_FNS:
            return call_operator(tx, fn, args, kwargs)
        if fn in _FOLDABLE_BUILTINS or (isinstance(fn, type) and fn.__module__ == "builtins"
                                        and fn in (int, float, bool, str, tuple, list, dict,
                                                   set, frozenset, slice, range)):
            cargs, ckwargs = _const_args(args, kwargs, f"builtin {self.name}")
            try:
                result = fn(*cargs, **ckwargs)
            except Exception as e:  # noqa: BLE001
                raise Unsupported(f"builtin {self.name} raised {type(e).__name__}: {e}") from e
            return wrap_constant_result(result, what=f"builtin {self.name}")
        raise Unsupported(f"call to builtin {self.name}")


def _has_tensor(args) -> bool:
    from .tensor import TensorVariable

    return any(isinstance(a, TensorVariable) for a in args)


def call_operator(tx, fn, args, kwargs) -> VariableTracker:
    """``operator.<fn>(*args)`` on trackers (also what BINARY_OP / COMPARE_OP use)."""
    from .containers import BaseSequenceVariable, ConstDictVariable, ListVariable, TupleVariable

    if kwargs:
        raise Unsupported(f"operator.{fn.__name__} with keyword arguments")
    name = getattr(fn, "__name__", repr(fn))
    if fn in (operator.is_, operator.is_not):
        return is_op(tx, args[0], args[1], negate=fn is operator.is_not)
    if fn is operator.contains:
        return contains_op(tx, args[1], args[0])
    if fn is operator.getitem:
        return tx.getitem(args[0], args[1])
    if fn in (operator.not_, operator.truth):
        truth = args[0].truth_value(tx)
        return ConstantVariable(not truth if fn is operator.not_ else truth)
    if _has_tensor(args):
        if fn not in _TENSOR_OPERATORS:
            raise Unsupported(f"operator.{name} on a tensor")
        if fn in _OUT_OF_PLACE and not _has_tensor(args[:1]):
            # ``n += t`` with a Python number ``n`` rebinds n to ``n + t``; FX would print
            # the in-place form as ``0 += t``, which is not Python
            fn = _OUT_OF_PLACE[fn]
        return tx.output.create_graph_op("call_function", fn, list(args), {})
    from ...shapes import SYM_OPERATORS, has_symnode, sym_operator

    if has_symnode(args) and fn in SYM_OPERATORS:  # arithmetic on symbolic sizes
        return sym_operator(tx, fn, list(args))
    # sequences
    if len(args) == 2:
        a, b = args
        if isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable) and \
                fn in (operator.add, operator.iadd) and a.python_cls is b.python_cls:
            if fn is operator.iadd and isinstance(a, ListVariable):
                a.check_mutable("list +=")
                a.items.extend(b.items)
                return a
            return type(a)(a.items + b.items) if isinstance(a, ListVariable) else \
                TupleVariable(a.items + b.items)
        if fn in (operator.mul, operator.imul) and (
                isinstance(a, BaseSequenceVariable) or isinstance(b, BaseSequenceVariable)):
            seq, n = (a, b) if isinstance(a, BaseSequenceVariable) else (b, a)
            try:
                times = n.as_python_constant()
            except NotConstant:
                raise Unsupported("repeating a sequence a non-constant number of times") from None
            items = seq.items * times
            return ListVariable(items) if isinstance(seq, ListVariable) else TupleVariable(items)
        if fn in (operator.eq, operator.ne) and not (a.is_python_constant()
                                                     and b.is_python_constant()):
            if isinstance(a, (BaseSequenceVariable, ConstDictVariable)) or isinstance(
                    b, (BaseSequenceVariable, ConstDictVariable)):
                raise Unsupported("comparing containers with non-constant items")
            ia = _identity(a)
            ib = _identity(b)
            if ia is not None and ib is not None:
                same = ia is ib
                return ConstantVariable(same if fn is operator.eq else not same)
    cargs, _ = _const_args(args, {}, f"operator.{name}")
    try:
        result = fn(*cargs)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"operator.{name} raised {type(e).__name__}: {e}") from e
    return wrap_constant_result(result, what=f"operator.{name}")


def _identity(v: VariableTracker) -> Any:
    """The real object behind a tracker when it is known (modules, functions, constants)."""
    for attr in ("module", "value", "fn", "cls"):
        obj = getattr(v, attr, None)
        if obj is not None:
            return obj
    return None


def _same_input(tx, a, b) -> bool:
    """Whether two tensors that came from the frame are one object (guarded)."""
    from ...sources import IdentitySource

    src = IdentitySource(a.source, b.source)
    if not src.guardable:
        raise Unsupported("`is` between two input tensors that cannot be guarded")
    real = {node: value for node, _src, value in tx.output.graph_inputs}
    for tv in (a, b):
        if tv.node.op == "get_attr":
            real[tv.node] = tx.output.attr_tensors[tv.node.target]
    if a.node not in real or b.node not in real:
        raise Unsupported("`is` between two input tensors")
    same = real[a.node] is real[b.node]
    tx.output.guards.add(Guard(src, GuardKind.CONSTANT_MATCH, same, "identity"))
    return same


def is_op(tx, a: VariableTracker, b: VariableTracker, *, negate: bool) -> VariableTracker:
    from .tensor import TensorVariable

    def result(same: bool) -> VariableTracker:
        return ConstantVariable(same != negate)

    if a is b:
        return result(True)
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        if a.node is b.node:
            return result(True)
        if a.source is not None and b.source is not None:
            # two inputs may or may not be the same object: decide now, guard the answer
            return result(_same_input(tx, a, b))
        return result(False)
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return result(False)
    if (a.mutable and a.source is None) or (b.mutable and b.source is None):
        # an object made while tracing is only ever the same tracker
        return result(False)
    if a.is_python_constant() and b.is_python_constant():
        return result(a.as_python_constant() is b.as_python_constant())
    ia, ib = _identity(a), _identity(b)
    if ia is not None and ib is not None:
        return result(ia is ib)
    from .misc import NullVariable

    if isinstance(a, NullVariable) or isinstance(b, NullVariable):
        raise Unsupported("`is` on NULL")
    # different tracker kinds with known python types: different objects
    try:
        ta, tb = a.python_type(), b.python_type()
        if ta is not tb:
            return result(False)
    except Unsupported:
        pass
    raise Unsupported(f"`is` between {a.describe()} and {b.describe()}")


def contains_op(tx, container: VariableTracker, item: VariableTracker) -> VariableTracker:
    from .containers import BaseSequenceVariable, ConstDictVariable

    contains = getattr(container, "contains", None)
    if contains is not None:
        return contains(tx, item)

    if isinstance(container, ConstDictVariable):
        try:
            return ConstantVariable(item.as_python_constant() in container.items)
        except NotConstant:
            raise Unsupported("`in` on a dict with a non-constant key") from None
    if container.is_python_constant() and item.is_python_constant():
        return ConstantVariable(item.as_python_constant() in container.as_python_constant())
    if isinstance(container, BaseSequenceVariable):
        if item.is_python_constant():
            target = item.as_python_constant()
            found = False
            for el in container.items:
                if el.is_python_constant() and el.as_python_constant() == target:
                    found = True
                    break
                if not el.is_python_constant():
                    raise Unsupported("`in` on a sequence with non-constant items")
            return ConstantVariable(found)
        ident = _identity(item)
        if ident is not None and all(_identity(el) is not None for el in container.items):
            return ConstantVariable(any(_identity(el) is ident for el in container.items))
    raise Unsupported(f"`in` between {item.describe()} and {container.describe()}")


# -- handlers for individual builtins -------------------------------------------------


def _b_len(tx, args, kwargs):
    from .containers import BaseSequenceVariable, ConstDictVariable
    from .tensor import TensorVariable

    if len(args) != 1 or kwargs:
        return None
    (x,) = args
    if isinstance(x, TensorVariable):
        if x.example_value.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return ConstantVariable(int(x.example_value.shape[0]))
    if isinstance(x, (BaseSequenceVariable, ConstDictVariable)):
        return ConstantVariable(len(x.items))
    if hasattr(x, "module") and hasattr(x.module, "__len__"):
        if hasattr(x, "guard_structure"):  # a module container: its length is guarded
            x.guard_structure(tx)
        return ConstantVariable(len(x.module))
    if hasattr(x, "len_value"):
        return ConstantVariable(x.len_value(tx))
    return None


def _python_type_of(tx, v: VariableTracker) -> type:
    return v.python_type()


def _b_isinstance(tx, args, kwargs):
    if len(args) != 2 or kwargs:
        return None
    obj, cls_var = args
    try:
        cls = cls_var.as_python_constant()
    except NotConstant:
        raise Unsupported("isinstance() with a non-constant class") from None
    typ = _python_type_of(tx, obj)
    try:
        return ConstantVariable(issubclass(typ, cls))
    except TypeError as e:
        raise Unsupported(f"isinstance(): {e}") from e


def _b_issubclass(tx, args, kwargs):
    cargs, ckwargs = _const_args(args, kwargs, "issubclass")
    return ConstantVariable(issubclass(*cargs, **ckwargs))


def _b_type(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    typ = args[0].python_type()
    from .misc import wrap_class

    return wrap_class(typ)


def _b_iter(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if len(args) != 1 or kwargs:
        return None
    if isinstance(args[0], ListIteratorVariable):
        return args[0]
    return ListIteratorVariable(tx.unpack_sequence(args[0]))


def _b_next(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if not args or kwargs or not isinstance(args[0], ListIteratorVariable):
        return None
    item = args[0].next_item()
    if item is None:
        if len(args) == 2:
            return args[1]
        raise Unsupported("next() on an exhausted iterator (StopIteration)")
    return item


def _b_enumerate(tx, args, kwargs):
    from .containers import ListIteratorVariable, TupleVariable

    if not args:
        return None
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    try:
        s = start.as_python_constant()
    except NotConstant:
        raise Unsupported("enumerate() with a non-constant start") from None
    items = tx.unpack_sequence(args[0])
    return ListIteratorVariable([TupleVariable([ConstantVariable(s + i), it])
                                 for i, it in enumerate(items)])


def _b_zip(tx, args, kwargs):
    from .containers import ListIteratorVariable, TupleVariable

    if kwargs and set(kwargs) != {"strict"}:
        return None
    seqs = [tx.unpack_sequence(a) for a in args]
    return ListIteratorVariable([TupleVariable(list(group)) for group in zip(*seqs, strict=False)])


def _b_reversed(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if len(args) != 1 or kwargs:
        return None
    return ListIteratorVariable(list(reversed(tx.unpack_sequence(args[0]))))


def _b_tuple_list(kind):
    def handler(tx, args, kwargs):
        from .containers import ListVariable, TupleVariable

        if kwargs or len(args) > 1:
            return None
        items = tx.unpack_sequence(args[0]) if args else []
        return TupleVariable(items) if kind is tuple else ListVariable(items)

    return handler


def _b_dict(tx, args, kwargs):
    from .containers import ConstDictVariable

    items: dict[Any, VariableTracker] = {}
    if len(args) > 1:
        return None
    if args:
        src = args[0]
        if isinstance(src, ConstDictVariable):
            items.update(src.items)
        else:
            for pair in tx.unpack_sequence(src):
                k, v = tx.unpack_sequence(pair)
                try:
                    items[k.as_python_constant()] = v
                except NotConstant:
                    raise Unsupported("dict() with a non-constant key") from None
    items.update(kwargs)
    return ConstDictVariable(items)


def _b_getattr(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    try:
        name = args[1].as_python_constant()
    except NotConstant:
        raise Unsupported("getattr() with a non-constant name") from None
    if len(args) == 3:
        has = _b_hasattr(tx, args[:2], {})
        if has is not None and not has.as_python_constant():
            return args[2]
        try:
            return tx.getattr(args[0], name)
        except Unsupported as e:
            if "has no attribute" in str(e):
                return args[2]
            raise
    return tx.getattr(args[0], name)


def _b_hasattr(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    try:
        name = args[1].as_python_constant()
    except NotConstant:
        raise Unsupported("hasattr() with a non-constant name") from None
    obj = _identity(args[0])
    from .tensor import TensorVariable

    if obj is not None and not isinstance(obj, torch.Tensor):
        result = hasattr(obj, name)
    elif isinstance(args[0], TensorVariable):
        return ConstantVariable(hasattr(args[0].example_value, name))
    elif getattr(args[0], "has_attr", None) is not None:
        result = args[0].has_attr(tx, name)
    else:
        return None
    if args[0].source is not None:  # an attribute added or deleted later recompiles
        from ...guards import Guard

        tx.output.guards.add(Guard(args[0].source, GuardKind.HASATTR, (name, bool(result))))
    return ConstantVariable(result)


def _b_sum(tx, args, kwargs):
    if kwargs or not args or len(args) > 2:
        return None
    items = [tx.realize(it) for it in tx.unpack_sequence(args[0])]
    acc = args[1] if len(args) == 2 else ConstantVariable(0)
    for it in items:
        acc = call_operator(tx, operator.add, [acc, it], {})
    return acc


def _b_minmax(fn):
    def handler(tx, args, kwargs):
        if kwargs:
            return None
        items = tx.unpack_sequence(args[0]) if len(args) == 1 else list(args)
        items = [tx.realize(it) for it in items]
        if _has_tensor(items):
            raise Unsupported(f"{fn.__name__}() over tensors (data-dependent)")
        try:
            values = [it.as_python_constant() for it in items]
        except NotConstant:
            raise Unsupported(f"{fn.__name__}() over non-constants") from None
        try:
            result = fn(values)
        except (ValueError, TypeError) as e:
            raise Unsupported(f"{fn.__name__}() raised {type(e).__name__}: {e}") from None
        return wrap_constant_result(result, what=fn.__name__)

    return handler


def _b_abs(tx, args, kwargs):
    if len(args) == 1 and _has_tensor(args):
        return tx.output.create_graph_op("call_function", operator.abs, list(args), {})
    return None


def _b_scalar_cast(fn):
    def handler(tx, args, kwargs):
        if _has_tensor(args):
            raise Unsupported(f"{fn.__name__}() of a tensor (data-dependent)")
        return None

    return handler


def _b_callable(tx, args, kwargs):
    if len(args) != 1:
        return None
    v = args[0]
    obj = _identity(v)
    if obj is not None:
        return ConstantVariable(callable(obj))
    if isinstance(v, (UserFunctionVariable, NestedUserFunctionVariable, PartialVariable,
                      BuiltinVariable, NoOpVariable)):
        return ConstantVariable(True)
    try:
        cls = v.python_type()
    except Unsupported:
        return None
    return ConstantVariable(any("__call__" in k.__dict__ for k in cls.__mro__))


def _b_super(tx, args, kwargs):
    if kwargs:
        return None
    if len(args) == 2:
        try:
            cls = args[0].as_python_constant()
        except NotConstant:
            raise Unsupported("super() with a non-constant class") from None
        return SuperVariable(cls, args[1])
    if args:
        return None
    code = tx.code
    if "__class__" not in code.co_freevars or code.co_argcount == 0:
        raise Unsupported("super() outside a method")
    cls = tx.realize(tx.load_deref("__class__"))
    first = code.co_varnames[0]
    if first not in tx.symbolic_locals:
        raise Unsupported("super(): the first argument was deleted")
    obj = tx.realize(tx.symbolic_locals[first])
    tx.symbolic_locals[first] = obj
    return SuperVariable(cls.as_python_constant(), obj)


def _b_setattr(tx, args, kwargs):
    if kwargs or len(args) != 3:
        return None
    try:
        name = args[1].as_python_constant()
    except NotConstant:
        raise Unsupported("setattr() with a non-constant name") from None
    store = getattr(args[0], "store_attr", None)
    if store is None:  # an object from the frame: replayed after the graph
        tx.output.side_effects.store_attr(tx, args[0], name, args[2])
        return ConstantVariable(None)
    store(tx, name, args[2])
    return ConstantVariable(None)


def _b_sorted(tx, args, kwargs):
    if len(args) != 1:
        return None
    items = tx.unpack_sequence(args[0])
    key = kwargs.get("key")
    reverse = kwargs.get("reverse", ConstantVariable(False))
    if set(kwargs) - {"key", "reverse"}:
        return None
    try:
        rev = reverse.as_python_constant()
        if key is None or (key.is_python_constant() and key.as_python_constant() is None):
            values = [it.as_python_constant() for it in items]
            return ConstantVariable.create(sorted(values, reverse=rev))
    except NotConstant:
        pass
    if key is None:
        raise Unsupported("sorted() of non-constant items")
    # sort trackers by a key computed while tracing (must give constants)
    keyed = []
    for it in items:
        k = tx.call_function(key, [it], {})
        try:
            keyed.append((k.as_python_constant(), it))
        except NotConstant:
            raise Unsupported("sorted() with a key that is not a constant") from None
    from .containers import ListVariable

    order = sorted(range(len(keyed)), key=lambda i: keyed[i][0], reverse=rev)
    return ListVariable([keyed[i][1] for i in order])


def _b_map(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if kwargs or len(args) < 2:
        return None
    seqs = [tx.unpack_sequence(a) for a in args[1:]]
    return ListIteratorVariable([tx.call_function(args[0], list(group), {})
                                 for group in zip(*seqs, strict=False)])


def _b_filter(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if kwargs or len(args) != 2:
        return None
    out = []
    for item in tx.unpack_sequence(args[1]):
        keep = item if _is_none_var(args[0]) else tx.call_function(args[0], [item], {})
        if tx.realize(keep).truth_value(tx):
            out.append(item)
    return ListIteratorVariable(out)


def _is_none_var(v) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def _b_any_all(fn):
    def handler(tx, args, kwargs):
        if kwargs or len(args) != 1:
            return None
        values = [tx.realize(v).truth_value(tx) for v in tx.unpack_sequence(args[0])]
        return ConstantVariable(fn(values))

    return handler


def _b_id(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    obj = _identity(args[0])
    if obj is None or args[0].mutable:
        raise Unsupported(f"id() of {args[0].describe()}")
    if args[0].source is not None:  # the id is baked: the object must be the same one
        from ...guards import Guard

        tx.output.guards.add(Guard(args[0].source, GuardKind.ID_MATCH, id(obj), "object"))
    return ConstantVariable(id(obj))


_BUILTIN_HANDLERS: dict[Any, Any] = {
    super: _b_super,
    id: _b_id,
    setattr: _b_setattr,
    map: _b_map,
    filter: _b_filter,
    any: _b_any_all(any),
    all: _b_any_all(all),
    sorted: _b_sorted,
    len: _b_len,
    isinstance: _b_isinstance,
    issubclass: _b_issubclass,
    type: _b_type,
    iter: _b_iter,
    next: _b_next,
    enumerate: _b_enumerate,
    zip: _b_zip,
    reversed: _b_reversed,
    tuple: _b_tuple_list(tuple),
    list: _b_tuple_list(list),
    dict: _b_dict,
    getattr: _b_getattr,
    hasattr: _b_hasattr,
    sum: _b_sum,
    min: _b_minmax(min),
    max: _b_minmax(max),
    abs: _b_abs,
    int: _b_scalar_cast(int),
    float: _b_scalar_cast(float),
    bool: _b_scalar_cast(bool),
    callable: _b_callable,
}

#: builtins that are classes (tuple, list, range...) are wrapped as BuiltinVariable too
BUILTIN_CLASSES = frozenset({
    int, float, bool, str, tuple, list, dict, set, frozenset, slice, range, enumerate, zip,
    reversed, type, bytes, complex, object, super, map, filter,
})


def is_builtin_callable(value: Any) -> bool:
    from .stdlib import BUILTIN_HANDLERS as stdlib_handlers

    return (value in _BUILTIN_HANDLERS or value in _FOLDABLE_BUILTINS or
            value in stdlib_handlers or
            value in _OPERATOR_FNS or value in BUILTIN_CLASSES or
            getattr(value, "__module__", None) in ("builtins", "_operator", "operator"))

