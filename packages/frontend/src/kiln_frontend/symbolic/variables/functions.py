"""User functions (inlined), methods, functions made while tracing, ``super()``,
``functools.partial``, and pure stdlib helpers run at trace time.  Builtins are in
``builtins.py``, operators in ``operators.py``."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any

from ...bytecode import builders
from ...exc import Unsupported
from ...guards import Guard, GuardKind
from ...layers import upper
from .base import NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable
from .operators import constant_args, known_object

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


@upper.provide
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


@upper.provide
def method_of_class(tx, fn: types.FunctionType, obj: VariableTracker, source) -> VariableTracker:
    """``obj.<name>`` found on ``obj``'s class: the bound method, with an ID_MATCH guard on
    ``<source>.__func__``, so that replacing the method on the class, or shadowing it with an
    instance attribute (a monkeypatched ``forward``), recompiles."""
    from ...sources import AttrSource

    if source is not None:
        tx.output.guards.add(Guard(AttrSource(source, "__func__"), GuardKind.ID_MATCH,
                                   id(fn), "method"))
    return UserMethodVariable(fn, obj, source=source)


@upper.provide
def method_of_pinned_class(tx, cls: type, name: str, fn: types.FunctionType,
                           obj: VariableTracker) -> VariableTracker:
    """``obj.<name>`` found on ``cls`` for an object without a source (made in the frame): the
    class is pinned (``OutputGraph.pinned_source``) and ``cls.<name>`` guarded by ID_MATCH,
    so replacing the method on the class recompiles."""
    guard_class_member(tx, cls, name, fn)
    return UserMethodVariable(fn, obj)


@upper.provide
def guard_class_member(tx, cls: type, name: str, member: Any) -> None:
    """ID_MATCH on ``cls.<name>`` (the class pinned as a global): a method, ``__init__`` or
    property getter that the frame inlined must still be the class's."""
    from ...sources import AttrSource

    src = AttrSource(tx.output.pinned_source(cls), name)
    tx.output.guards.add(Guard(src, GuardKind.ID_MATCH, id(member), "class member"))


@upper.provide
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
        #: attributes the frame assigned (``fn.__wrapped__ = f``, ``fn.calls = 0``): the
        #: function's ``__dict__``, set again on the rebuilt function
        self.attrs: dict[str, VariableTracker] = {}
        #: writable function attributes the frame assigned (``functools.update_wrapper``:
        #: ``__module__``, ``__name__``...), also set again on the rebuilt function
        self.special_attrs: dict[str, VariableTracker] = {}
        #: MAKE_FUNCTION had annotations (not modelled: ``__annotations__`` breaks)
        self.has_annotations = False

    #: attributes that change what the function is (not kept in its ``__dict__``)
    _FIXED = frozenset({"__code__", "__closure__", "__globals__", "__defaults__",
                        "__kwdefaults__", "__dict__", "__name__", "__qualname__",
                        "__module__", "__annotations__", "__builtins__"})

    def get_code(self):
        return self.code

    #: the ``_FIXED`` names a store may change, with the type the value must have
    _WRITABLE = {"__module__": object, "__name__": str, "__qualname__": str,
                 "__annotations__": dict}

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        if name in self._WRITABLE or name in ("__doc__", "__type_params__"):
            kind = self._WRITABLE.get(name, object)
            if name == "__type_params__" or kind is not object:
                try:
                    ok = isinstance(value.python_type(), type) and \
                        issubclass(value.python_type(), tuple if name == "__type_params__"
                                   else kind)
                except Unsupported:
                    ok = False
                if not ok:  # (eager raises TypeError)
                    raise Unsupported(f"assignment of {value.describe()} to {name!r} of "
                                      f"nested function {self.qualname}")
            self.special_attrs[name] = value
            return
        if name in self._FIXED:
            raise Unsupported(f"assignment to {name!r} of nested function {self.qualname}")
        self.attrs[name] = value

    def children(self):
        return [*self.special_attrs.values(), *self.attrs.values()]

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.special_attrs:
            return self.special_attrs[name]
        if name in self.attrs:
            return self.attrs[name]
        if name == "__doc__":  # (CPython: the code's first constant when it is a str)
            consts = self.code.co_consts
            doc = consts[0] if consts and isinstance(consts[0], str) else None
            return ConstantVariable.create(doc)
        if name == "__type_params__" and sys.version_info >= (3, 12):
            return ConstantVariable.create(())
        if name == "__annotations__" and not self.has_annotations:
            # made once, as CPython caches the empty dict it makes on first access
            from .containers import ConstDictVariable

            self.special_attrs[name] = ConstDictVariable({})
            return self.special_attrs[name]
        if name == "__dict__":  # the namespace itself: ``fn.__dict__.update(...)`` sets attrs
            from .containers import ConstDictVariable

            view = ConstDictVariable({})
            view.items = self.attrs
            return view
        if name == "__code__":
            return ConstantVariable(self.code)
        if name == "__closure__":
            from .containers import TupleVariable

            if not self.closure:
                return ConstantVariable(None)
            return TupleVariable([CellView(c) for c in self.closure])
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
        self._reconstruct_function(codegen)
        for name, value in [*self.special_attrs.items(), *self.attrs.items()]:
            # fn.name = value, fn kept on the stack
            codegen.extend(builders.copy(1))
            codegen(value)
            codegen.extend(builders.swap(2))
            codegen.extend(builders.store_attr(name))

    def _reconstruct_function(self, codegen):
        # MAKE_FUNCTION again, with the same cells (LOAD_CLOSURE of the frame's own cell
        # and free variables)
        from .misc import LocalCellVariable

        if any(isinstance(c, LocalCellVariable) and c.tx.parent is not None
               for c in self.closure):
            return self._reconstruct_with_cells(codegen)
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

    def _reconstruct_with_cells(self, codegen):
        """A closure over an inlined function's cells (made by a factory inlined in the
        frame): ``types.FunctionType(code, globals, name, defaults, cells)``, each inlined
        cell made once per compiled frame (``types.CellType(final value)``) and shared by
        every function rebuilt over it; the frame's own cells are loaded as they are."""
        from .misc import LocalCellVariable

        if self.kwdefaults:
            raise Unsupported(f"cannot rebuild function {self.qualname} with keyword defaults")
        codegen.push_null()
        codegen.load_const_object(types.FunctionType)
        codegen.load_const_object(self.code)
        codegen.load_const_object(self.f_globals)
        codegen.load_const(self.code.co_name)
        for d in self.defaults:
            codegen(d)
        if self.defaults:
            codegen.build_tuple(len(self.defaults))
        else:
            codegen.load_const(None)
        for cell in self.closure:
            _load_cell(codegen, cell, LocalCellVariable)
        codegen.build_tuple(len(self.closure))
        codegen.call_function(5)

    def describe(self) -> str:
        return f"NestedUserFunctionVariable({self.qualname})"


class CellView(VariableTracker):
    """``fn.__closure__[i]`` of a function made while tracing: ``cell_contents`` reads the
    cell as the function's own body would (LOAD_DEREF)."""

    def __init__(self, cell: VariableTracker):
        super().__init__()
        self.cell = cell

    def python_type(self) -> type:
        return types.CellType

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "cell_contents":
            return self.cell.load(tx)
        raise Unsupported(f"attribute {name!r} of a closure cell")

    def describe(self) -> str:
        return f"CellView({self.cell.describe()})"


def _load_cell(codegen, cell, local_cell_cls) -> None:
    """Push the cell object ``cell`` stands for; an inlined function's cell is made once
    per codegen (empty, kept in a temporary, then given its final value: a function
    whose cell holds itself finds the cell already made)."""
    from ...bytecode import create_instruction

    name = getattr(cell, "name", None)
    if isinstance(cell, local_cell_cls) and cell.tx.parent is None or \
            type(cell).__name__ == "RootFreeVarCell":
        if name not in codegen.cellvars and name not in codegen.freevars:
            raise Unsupported(f"cannot rebuild a closure over {name!r}")
        codegen.append(create_instruction("LOAD_CLOSURE", argval=name))
        return
    if type(cell).__name__ == "ClosureCellVariable":
        codegen.load_const_object(cell.cell)
        return
    if not isinstance(cell, local_cell_cls):
        raise Unsupported(f"cannot rebuild a closure cell ({cell.describe()})")
    cells = codegen.__dict__.setdefault("rebuilt_cells", {})
    key = (id(cell.tx), name)
    if key not in cells:
        from .misc import DeletedVariable, LazyVariable

        temp = f"___kiln_cell_{len(cells)}"
        value = cell.tx.symbolic_locals.get(name)
        codegen.push_null()
        codegen.load_const_object(types.CellType)
        codegen.call_function(0)
        codegen.store_fast(temp)
        cells[key] = (temp, cell.tx)  # the translator kept alive with the key's id
        if not (value is None or isinstance(value, DeletedVariable) or (
                isinstance(value, LazyVariable) and value.realized is None and
                value.source is None)):
            codegen(value)
            codegen.load_fast(temp)
            codegen.extend(builders.store_attr("cell_contents"))
    codegen.load_fast(cells[key][0])


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
        slot_method = getattr(self.obj, "slot_method", None)
        slot = slot_method(tx, attr) if slot_method is not None else None
        if slot is not None:  # object.__getattribute__, nn.Module.__getattr__ (attributes.py)
            return slot
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


@upper.provide
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
        codegen.extend(builders.call_function_ex(True))

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
        cargs, ckwargs = constant_args(args, kwargs, f"{self.value!r}")
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
    obj = known_object(v)
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
