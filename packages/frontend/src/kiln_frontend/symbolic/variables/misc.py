"""Small trackers: NULL, lazy frame arguments, closure cells, classes, opaque objects."""

from __future__ import annotations

import enum
import inspect
import types
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from ...sources import AttrSource
from .attributes import MISSING as MISSING_ATTR
from .attributes import AttributeOwner, is_slot_of
from .base import BoundMethodVariable, NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable, wrap_constant_result
from .raising import raise_traced

#: ``Py_TPFLAGS_HEAPTYPE``: a class made by a class statement (its attributes can change)
_HEAPTYPE = 1 << 9


class NullVariable(VariableTracker):
    """The NULL the 3.11+ call convention puts under a callable."""

    def reconstruct(self, codegen):
        codegen.push_null()

    def describe(self) -> str:
        return "NULL"


class DeletedVariable(VariableTracker):
    """An unbound local saved by 3.12's LOAD_FAST_AND_CLEAR (inlined comprehensions)."""

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild an unbound local")

    def describe(self) -> str:
        return "<unbound>"


class SavedCellVariable(VariableTracker):
    """A function's own cell saved by LOAD_FAST_AND_CLEAR when an inlined comprehension
    reuses its slot for a plain value (3.13 then reads the slot with LOAD_FAST): the
    STORE_FAST that puts it back makes the slot a cell again.  ``value`` is what the
    symbolic locals held for the cell's contents."""

    def __init__(self, value: VariableTracker):
        super().__init__()
        self.value = value

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild a cell saved by an inlined comprehension")

    def describe(self) -> str:
        return f"<saved cell {self.value.describe()}>"


class LazyVariable(VariableTracker):
    """A frame argument not looked at yet: built (and guarded) on first use, otherwise only
    reloaded from its source."""

    def __init__(self, value: Any, source):
        super().__init__(source=source)
        self.value = value
        self.realized: VariableTracker | None = None

    def realize(self, tx) -> VariableTracker:
        if self.realized is None:
            self.realized = tx.wrap_value(self.value, self.source)
        return self.realized

    def describe(self) -> str:
        return f"LazyVariable({self.source.name()})"


def load_real_cell(tx, holder: VariableTracker, source, unbound: str) -> VariableTracker:
    """The value of ``holder.cell``, a real cell: what the frame stored in it while traced
    (side effects) if anything, else its contents, wrapped once from ``source`` (kept in
    ``holder._value``); an empty cell is ``Unsupported(unbound)``."""
    stored = tx.output.side_effects.load_cell(holder.cell)
    if stored is not None:
        return stored
    if holder._value is None:
        try:
            contents = holder.cell.cell_contents
        except ValueError:
            raise Unsupported(unbound) from None
        holder._value = tx.wrap_value(contents, source)
    return holder._value


class ClosureCellVariable(VariableTracker):
    """A real closure cell of an inlined function."""

    def __init__(self, cell: types.CellType, source):
        super().__init__(source=source)
        self.cell = cell
        self._value: VariableTracker | None = None

    def load(self, tx) -> VariableTracker:
        return load_real_cell(tx, self, self.source, "free variable referenced before assignment")

    def store(self, tx, value: VariableTracker) -> None:
        """A write to a cell that outlives the frame: replayed after the graph (and seen
        by every later read in the frame, through any function closing over it)."""
        tx.output.side_effects.store_cell(self.cell, value)


class LocalCellVariable(VariableTracker):
    """A cell of a translator's own local (``LOAD_CLOSURE``): reads and writes go to that
    translator's symbolic locals."""

    def __init__(self, tx, name: str):
        super().__init__()
        self.tx = tx
        self.name = name

    def load(self, tx) -> VariableTracker:
        try:
            return self.tx.symbolic_locals[self.name]
        except KeyError:
            raise Unsupported(f"free variable {self.name!r} referenced before assignment") \
                from None

    def store(self, tx, value: VariableTracker) -> None:
        self.tx.symbolic_locals[self.name] = value

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild a closure cell")


class FreshCellVariable(VariableTracker):
    """A cell MAKE_CELL makes after the prologue: 3.12 inlines a comprehension whose
    variable a closure captures as ``LOAD_FAST_AND_CLEAR i; MAKE_CELL i; ...; STORE_FAST
    i`` (the outer value back in the slot). Closures made in the comprehension keep this
    cell and its last value, apart from the frame's local of that name."""

    def __init__(self, name: str, value: VariableTracker | None):
        super().__init__()
        self.name = name
        self.value = value

    def load(self, tx) -> VariableTracker:
        if self.value is None:
            raise Unsupported(f"free variable {self.name!r} referenced before assignment")
        return self.value

    def store(self, tx, value: VariableTracker) -> None:
        self.value = value

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild a comprehension's closure cell")


@upper.provide
def wrap_class(cls: type, source=None) -> VariableTracker:
    if cls in upper.BUILTIN_CLASSES:
        return upper.BuiltinVariable(cls, source=source)
    return UserDefinedClassVariable(cls, source=source)


#: classes that can be called on constants at trace time (``Mode(2)`` looks a member up)
_FOLDABLE_CLASSES = (torch.Size, torch.device, torch.dtype, enum.Enum)


@tracker_for(type)
class UserDefinedClassVariable(VariableTracker):
    """A class object (``torch.Tensor``, ``torch.Size``, a user's class)."""

    def __init__(self, cls: type, *, source=None):
        super().__init__(source=source)
        self.cls = cls

    @classmethod
    def wrap(cls, builder, value):
        if value in upper.BUILTIN_CLASSES:
            return upper.BuiltinVariable(value, source=builder.source)
        if builder.source is not None:
            builder.install_guard(GuardKind.ID_MATCH, id(value), what="class")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.cls

    def python_type(self) -> type:
        return type(self.cls)

    def has_unpack_var_sequence(self, tx) -> bool:
        return issubclass(self.cls, enum.Enum)

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        """``for m in Mode``: an enum class's members (fixed once the class exists)."""
        if not issubclass(self.cls, enum.Enum):
            raise Unsupported(f"iterating over {self.describe()}")
        return [ConstantVariable(m) for m in self.cls]

    def var_getattr(self, tx, name: str) -> VariableTracker:
        side_effects = tx.output.side_effects
        stored = side_effects.class_store(self.cls, name)
        if stored is not None:  # ``Cls.count += 1`` earlier in the frame
            return stored
        if name == "__dict__" and side_effects.has_class_stores():
            raise Unsupported(f"{self.describe()}.__dict__ after a store to a class attribute")
        try:
            value = inspect.getattr_static(self.cls, name)
        except AttributeError:
            if type(self.cls) is type and not self.cls.__flags__ & _HEAPTYPE:
                # a built-in type (``function``, ``int``): no attribute can appear on it
                # later, nor come from a metaclass's __getattr__ (ExitStack.push looks
                # ``__exit__`` up on a plain callback's type)
                raise_traced(AttributeError, f"type object {self.cls.__name__!r} has no "
                                             f"attribute {name!r}")
            raise Unsupported(f"class {self.cls.__qualname__} has no attribute {name!r}") \
                from None
        if isinstance(value, (staticmethod, classmethod)):
            value = getattr(self.cls, name)
        # a class reached without a source (``type(x)``, ``x.__class__``) is pinned
        base = self.source if self.source is not None else tx.output.pinned_source(self.cls)
        src = AttrSource(base, name)
        if self.cls.__module__.split(".")[0] == "torch":
            return tx.wrap_value(getattr(self.cls, name), src, guard=False)
        if name == "apply" and issubclass(self.cls, torch.autograd.Function):
            from .autograd_function import AutogradFunctionApplyVariable

            return AutogradFunctionApplyVariable(self.cls, self, source=src)
        return tx.wrap_value(getattr(self.cls, name), src)

    def call_function(self, tx, args, kwargs):
        import functools

        from .ctx_managers import CONTEXT_MANAGER_CLASSES

        factory = CONTEXT_MANAGER_CLASSES.get(self.cls)
        if factory is not None:
            return factory(tx, self.cls, list(args), dict(kwargs))
        construct = upper.constructor_for(self.cls)
        if construct is not None:
            built = construct(tx, self.cls, list(args), dict(kwargs))
            if built is not None:
                return built
        from .model_output import ModelOutputVariable, is_model_output_class

        if is_model_output_class(self.cls):
            return ModelOutputVariable.construct(tx, self.cls, list(args), dict(kwargs))
        if self.cls is functools.partial:
            if not args:
                raise Unsupported("functools.partial() without a function")
            return upper.PartialVariable(args[0], list(args[1:]), dict(kwargs))
        if issubclass(self.cls, _FOLDABLE_CLASSES):
            try:
                cargs = [a.as_python_constant() for a in args]
                ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
            except NotConstant:
                raise Unsupported(f"{self.cls.__qualname__}() with non-constant arguments") \
                    from None
            return wrap_constant_result(self.cls(*cargs, **ckwargs),
                                        what=self.cls.__qualname__)
        if issubclass(self.cls, tuple) and hasattr(self.cls, "_fields"):
            from .containers import TupleVariable

            names = list(self.cls._fields)
            values = list(args) + [None] * (len(names) - len(args))
            if len(values) != len(names):
                raise Unsupported(f"{self.cls.__qualname__}() with too many arguments")
            for k, v in kwargs.items():
                if k not in names:
                    raise Unsupported(f"{self.cls.__qualname__}() got an unexpected {k!r}")
                values[names.index(k)] = v
            defaults = getattr(self.cls, "_field_defaults", {})
            for i, (n, v) in enumerate(zip(names, values, strict=True)):
                if v is None and n in defaults:
                    values[i] = tx.wrap_value(defaults[n], None)
            if any(v is None for v in values):
                raise Unsupported(f"{self.cls.__qualname__}() missing arguments")
            return TupleVariable(values, tuple_cls=self.cls)
        if is_plain_python_class(self.cls):
            return construct_object(tx, self.cls, args, kwargs)
        raise Unsupported(f"creating an instance of {self.cls.__qualname__}")

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen.load_const_object(self.cls)

    def describe(self) -> str:
        return f"UserDefinedClassVariable({self.cls.__qualname__})"


def python_dunder(cls: type, name: str) -> types.FunctionType | None:
    """``cls.<name>`` when it is a Python function (so calling it can be inlined)."""
    attr = inspect.getattr_static(cls, name, None)
    return attr if isinstance(attr, types.FunctionType) else None


class PythonProtocolMixin:
    """``iter()``, ``len()``, ``obj[i]`` and ``obj(...)`` on objects whose class defines
    ``__iter__``, ``__len__``, ``__getitem__``, ``__call__`` in Python: the method is
    inlined (operators: ``operators.python_data_model``)."""

    def _call_dunder(self, tx, name: str, args: list) -> VariableTracker:
        cls = self.python_type()
        fn = python_dunder(cls, name)
        if fn is None:
            raise Unsupported(f"{cls.__qualname__} has no Python {name}")
        return tx.call_function(upper.method_of_pinned_class(tx, cls, name, fn, self), args, {})

    def has_unpack_var_sequence(self, tx) -> bool:
        cls = self.python_type()
        return python_dunder(cls, "__iter__") is not None or (
            python_dunder(cls, "__getitem__") is not None and
            python_dunder(cls, "__len__") is not None)

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        import collections.abc

        from .containers import ListIteratorVariable

        cls = self.python_type()
        iter_fn = python_dunder(cls, "__iter__")
        if iter_fn is collections.abc.Sequence.__iter__ and \
                python_dunder(cls, "__len__") is not None:
            iter_fn = None  # self[0], ..., self[len - 1]: the same items, no IndexError
        if iter_fn is not None:
            it = tx.realize(self._call_dunder(tx, "__iter__", []))
            if isinstance(it, ListIteratorVariable) or it.has_unpack_var_sequence(tx):
                return it.unpack_var_sequence(tx)
            raise Unsupported(f"{cls.__qualname__}.__iter__ returned {it.describe()}")
        n = self.len_value(tx)
        return [self._call_dunder(tx, "__getitem__", [ConstantVariable(i)]) for i in range(n)]

    def len_value(self, tx) -> int:
        n = tx.realize(self._call_dunder(tx, "__len__", []))
        try:
            return int(n.as_python_constant())
        except NotConstant:
            raise Unsupported("__len__ returned a non-constant") from None

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        return self._call_dunder(tx, "__getitem__", [index])

    def truth_value(self, tx) -> bool:
        """``bool(obj)``: the class's Python ``__bool__``, else ``__len__() != 0``, else
        True (``object`` has neither); a C ``__bool__``/``__len__`` is a graph break."""
        cls = self.python_type()
        for name in ("__bool__", "__len__"):
            if getattr(cls, name, None) is None:
                continue
            if python_dunder(cls, name) is None:
                raise Unsupported(f"truth value of {self.describe()} ({name} is not Python)")
            if name == "__len__":
                return self.len_value(tx) != 0
            result = tx.realize(self._call_dunder(tx, "__bool__", []))
            try:
                value = result.as_python_constant()
            except NotConstant:
                raise Unsupported(f"{cls.__qualname__}.__bool__ returned "
                                  f"{result.describe()}") from None
            if not isinstance(value, bool):
                raise Unsupported(f"{cls.__qualname__}.__bool__ returned a "
                                  f"{type(value).__name__}")
            return value
        return True

    def contains(self, tx, item: VariableTracker) -> VariableTracker:
        if python_dunder(self.python_type(), "__contains__") is not None:
            return self._call_dunder(tx, "__contains__", [item])
        if self.has_unpack_var_sequence(tx):
            return membership(tx, self.unpack_var_sequence(tx), item)
        raise Unsupported(f"`in` on {self.describe()}")

    def call_function(self, tx, args, kwargs):
        """``obj(*args)``: the class's Python ``__call__`` inlined."""
        cls = self.python_type()
        fn = python_dunder(cls, "__call__")
        if fn is None:
            raise Unsupported(f"call to {self.describe()}")
        return tx.call_function(upper.method_of_pinned_class(tx, cls, "__call__", fn, self),
                                list(args), dict(kwargs))


def membership(tx, items: list[VariableTracker], item: VariableTracker) -> VariableTracker:
    """``item in items`` for constants (``==``) or known objects (identity)."""
    from .containers import TupleVariable

    return upper.contains_op(tx, TupleVariable(list(items)), item)


def _mapping_contains(tx, obj, key):
    """``collections.abc.Mapping.__contains__`` without its try/except: key in iter(obj)."""
    return membership(tx, obj.unpack_var_sequence(tx), key)


def _mapping_get(tx, obj, key, default=None):
    """``collections.abc.Mapping.get`` without its try/except."""
    found = _mapping_contains(tx, obj, key)
    if found.as_python_constant():
        return obj.getitem(tx, key)
    return default if default is not None else ConstantVariable(None)


def abc_mixin_overrides() -> dict[Any, Any]:
    """Methods of ``collections.abc`` mixins that rely on catching exceptions, replaced by
    equivalent code over the object's own ``__iter__``/``__getitem__`` (inlined)."""
    import collections.abc as abc_

    return {abc_.Mapping.__contains__: _mapping_contains, abc_.Mapping.get: _mapping_get}


ABC_MIXIN_OVERRIDES = abc_mixin_overrides()


class UserDefinedObjectVariable(PythonProtocolMixin, AttributeOwner, VariableTracker):
    """Any other object from the frame: guarded by TYPE_MATCH; plain instance attributes and
    methods defined in Python can be read; anything else is a graph break."""

    def __init__(self, value: Any, *, source=None):
        super().__init__(source=source)
        self.value = value

    @classmethod
    def wrap(cls, builder, value):
        if builder.source is not None:
            builder.install_guard(GuardKind.TYPE_MATCH, type(value))
        return cls(value, source=builder.source)

    def python_type(self) -> type:
        return type(self.value)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .attributes import load_attribute

        return load_attribute(tx, self, name)

    # AttributeOwner hooks (attributes.py has the lookup order) ---------------------------

    def _attr_source(self, name: str):
        return AttrSource(self.source, name) if self.source is not None else None

    def lookup_class(self) -> type:
        return type(self.value)

    def lookup_instance(self, tx, name: str):
        from .attributes import MISSING, namespace_view

        view = namespace_view(tx, self)
        if view is not None:  # the frame holds (and may have changed) obj.__dict__
            return view.items.get(name, MISSING)
        try:
            d = object.__getattribute__(self.value, "__dict__")
        except AttributeError:  # __slots__ only
            return MISSING
        if not isinstance(d, dict) or name not in d:
            return MISSING
        return tx.wrap_value(d[name], self._attr_source(name))

    def lookup_method(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        return upper.method_of_class(tx, fn, self, self._attr_source(name))

    def lookup_class_member(self, tx, name: str, value: Any, klass: type) -> VariableTracker:
        return tx.wrap_value(value, self._attr_source(name))

    def lookup_classmethod(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        return upper.method_of_class(tx, fn, wrap_class(type(self.value)), self._attr_source(name))

    def lookup_real(self, tx, name: str, why: str) -> VariableTracker:
        """``getattr(obj, name)`` now (custom lookups such as transformers'
        PretrainedConfig mapping names, slots, C descriptors); the guard re-reads it the
        same way."""
        obj = self.value
        try:
            value = getattr(obj, name)
        except AttributeError:
            return self.lookup_missing(tx, name)
        src = self._attr_source(name)
        if isinstance(value, types.MethodType) and value.__self__ is obj and \
                isinstance(value.__func__, types.FunctionType):
            return upper.method_of_class(tx, value.__func__, self, src)
        return tx.wrap_value(value, src)

    def lookup_getattr_fallback(self, tx, name: str, fallback: Any) -> VariableTracker:
        return self.lookup_real(tx, name, "its class defines __getattr__")

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        """``obj.name = value``: a property's Python setter is inlined (object.__setattr__
        calls it before the instance dict); other stores are recorded and replayed."""
        from .attributes import store_through_descriptor

        cls = type(self.value)
        if cls.__setattr__ is object.__setattr__ and \
                store_through_descriptor(tx, self, cls, name, value):
            return
        tx.output.side_effects.store_attr(tx, self, name, value)

    def has_attr(self, tx, name: str) -> bool:
        return hasattr(self.value, name)

    def describe(self) -> str:
        return f"UserDefinedObjectVariable({type(self.value).__qualname__})"


class GetAttrVariable(VariableTracker):
    """``obj.name`` that could not be resolved while tracing.  Loading it is deferred: using
    it raises the original reason (a graph break there), and generated code rebuilds it as
    ``obj.name`` so Python does the lookup."""

    def __init__(self, obj: VariableTracker, name: str, reason: Unsupported):
        super().__init__()
        self.obj = obj
        self.name = name
        self.reason = reason

    def children(self):
        return [self.obj]

    def _fail(self):
        raise Unsupported(self.reason.reason)

    def var_getattr(self, tx, name):
        self._fail()

    def call_function(self, tx, args, kwargs):
        self._fail()

    def truth_value(self, tx):
        self._fail()

    def reconstruct(self, codegen):
        codegen(self.obj)
        codegen.load_attr(self.name)

    def describe(self) -> str:
        return f"GetAttrVariable({self.obj.describe()}.{self.name})"


def is_plain_python_class(cls: type) -> bool:
    """A class whose instances can be built while tracing: defined in Python, default
    metaclass, ``object.__new__``, only Python classes in its MRO (no builtin or torch
    bases: tensors, modules, exceptions, dicts...).  ``__slots__`` are fine: their member
    descriptors are read and written as the object's ``slots`` (``_member_slot``)."""
    import abc

    if type(cls) not in (type, abc.ABCMeta) or cls.__new__ is not object.__new__:
        return False
    if getattr(cls, "__abstractmethods__", None):
        return False
    for klass in cls.__mro__[:-1]:
        if klass.__module__ == "builtins":
            return False
        if klass.__module__.split(".")[0] == "torch":
            return False
    return cls.__setattr__ is object.__setattr__ or _is_frozen_dataclass(cls)


def _is_frozen_dataclass(cls: type) -> bool:
    params = getattr(cls, "__dataclass_params__", None)
    return params is not None and getattr(params, "frozen", False)


def construct_object(tx, cls: type, args, kwargs) -> VariableTracker:
    """``cls(*args, **kwargs)`` for a plain Python class: a new FrameObjectVariable whose
    ``__init__`` is inlined (guarded: replacing it on the class recompiles)."""
    obj = FrameObjectVariable(cls)
    init = inspect.getattr_static(cls, "__init__")
    if init is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
    elif isinstance(init, types.FunctionType):
        result = tx.call_function(upper.method_of_pinned_class(tx, cls, "__init__", init, obj),
                                  list(args), dict(kwargs))
        if not (result.is_python_constant() and result.as_python_constant() is None):
            raise Unsupported(f"{cls.__qualname__}.__init__ returned a value")
    else:
        raise Unsupported(f"{cls.__qualname__}.__init__ is not a Python function")
    return obj


def new_object(cls: type, attrs: dict, slots: dict | None = None) -> Any:
    """What generated code calls to rebuild an object made while tracing."""
    obj = object.__new__(cls)
    if attrs:
        obj.__dict__.update(attrs)
    for name, value in (slots or {}).items():
        object.__setattr__(obj, name, value)  # (through the slot's member descriptor)
    return obj


def _generated_value_fields(cls: type) -> tuple[str, ...] | None:
    """The fields a frozen dataclass's generated ``__hash__`` hashes (as a tuple) and its
    generated ``__eq__`` compares, when both are generated (``dataclasses`` builds them
    from source text: their code's file is ``<string>``) and read the same fields; None
    for any other class."""
    import dataclasses

    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not (params.frozen and params.eq):
        return None
    for name in ("__eq__", "__hash__"):
        fn = cls.__dict__.get(name)
        code = getattr(fn, "__code__", None)
        if code is None or code.co_filename != "<string>":
            return None
    fields = dataclasses.fields(cls)
    compared = tuple(f.name for f in fields if f.compare)
    hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
    return compared if compared == hashed else None


class FrameObjectVariable(PythonProtocolMixin, AttributeOwner, VariableTracker):
    """An instance of a plain Python class created while tracing (a dataclass, a small
    record class): its attributes are trackers; generated code rebuilds it with
    ``new_object(cls, attrs)`` (no ``__init__`` re-run)."""

    mutable = True

    def __init__(self, cls: type, attrs: dict[str, VariableTracker] | None = None):
        super().__init__()
        self.cls = cls
        self.attrs: dict[str, VariableTracker] = dict(attrs or {})
        #: values of its ``__slots__`` members (an unset slot is absent: AttributeError)
        self.slots: dict[str, VariableTracker] = {}

    def python_type(self) -> type:
        return self.cls

    def children(self):
        return [*self.attrs.values(), *self.slots.values()]

    def describe(self) -> str:
        return f"FrameObjectVariable({self.cls.__qualname__})"

    def has_attr(self, tx, name: str) -> bool:
        from .attributes import traced_hasattr

        return traced_hasattr(tx, self, name in self.attrs, name)

    def value_key(self):
        """The key this object is as a dict key or set item (``ItemByValue``) when its
        class is a frozen dataclass whose ``__eq__`` and ``__hash__`` are the generated
        ones and the fields they read are hashable constants; None otherwise (the
        container refuses it)."""
        from .containers import ItemByValue

        fields = _generated_value_fields(self.cls)
        if fields is None or not all(f in self.attrs for f in fields):
            return None
        try:
            values = tuple(self.attrs[f].as_python_constant() for f in fields)
            hash(values)
        except (NotConstant, TypeError):
            return None
        return ItemByValue(self.cls, values, self)

    def _python_slot(self, name: str) -> types.FunctionType | None:
        """The class's own ``__getattribute__``/``__getattr__``/``__setattr__`` when it is
        Python code (transformers' configs map attribute names; strict dataclasses
        validate): inlined on this object, so a copy behaves as the original would."""
        fn = getattr(self.cls, name, None)
        base = getattr(object, name, None)
        if fn is None or fn is base:
            return None
        if not isinstance(fn, types.FunctionType):
            raise Unsupported(f"{self.cls.__qualname__}.{name} is not a Python function")
        return fn

    def _call_slot(self, tx, name: str, fn, args: list) -> VariableTracker:
        return upper.method_of_pinned_class(tx, self.cls, name, fn, self).call_function(
            tx, args, {})

    def builtin_method(self, tx, name: str) -> VariableTracker:
        """``object.__getattribute__``/``__setattr__``/``__delattr__`` bound to this object
        (what ``super().__getattribute__(k)`` in a custom ``__getattribute__`` reaches)."""
        if name in ("__getattribute__", "__setattr__", "__delattr__"):
            return FrameObjectSlotVariable(self, name)
        raise Unsupported(f"object.{name} on a {self.cls.__qualname__}")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .attributes import load_attribute

        return load_attribute(tx, self, name)

    # AttributeOwner hooks (attributes.py has the lookup order) ---------------------------

    def lookup_class(self) -> type:
        return self.cls

    def lookup_instance(self, tx, name: str):
        from .attributes import MISSING

        return self.attrs.get(name, MISSING)

    def _class_source(self, tx, name: str):
        # read through the class, pinned: replacing the class attribute recompiles
        return AttrSource(tx.output.pinned_source(self.cls), name)

    def lookup_method(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        return upper.method_of_pinned_class(tx, self.cls, name, fn, self)

    def lookup_class_member(self, tx, name: str, value: Any, klass: type) -> VariableTracker:
        return tx.wrap_value(value, self._class_source(tx, name))

    def lookup_classmethod(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        return upper.method_of_class(tx, fn, wrap_class(self.cls), self._class_source(tx, name))

    def lookup_namespace(self, tx) -> VariableTracker:
        # the namespace itself, not a copy: ``obj.__dict__[k] = v`` sets ``obj.k``
        from .containers import ConstDictVariable

        view = ConstDictVariable({})
        view.items = self.attrs
        return view

    def lookup_real(self, tx, name: str, why: str) -> VariableTracker:
        raise Unsupported(f"attribute {name!r} of {self.describe()} ({why})")

    def lookup_cache(self, tx, name: str, value: VariableTracker) -> None:
        self.attrs[name] = value

    def lookup_getattribute(self, tx, name: str, getattribute: Any) -> VariableTracker:
        if not isinstance(getattribute, types.FunctionType):
            raise Unsupported(f"{self.cls.__qualname__}.__getattribute__ is not a Python "
                              "function")
        return self._call_slot(tx, "__getattribute__", getattribute, [ConstantVariable(name)])

    def lookup_getattr_fallback(self, tx, name: str, fallback: Any) -> VariableTracker:
        if not isinstance(fallback, types.FunctionType):
            raise Unsupported(f"{self.cls.__qualname__}.__getattr__ is not a Python function")
        return self._call_slot(tx, "__getattr__", fallback, [ConstantVariable(name)])

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        if type(self.cls).__setattr__ is not type.__setattr__:
            raise Unsupported(f"setting {name!r} on a {self.cls.__qualname__} "
                              "(its metaclass defines __setattr__)")
        setattr_fn = self._python_slot("__setattr__")
        if setattr_fn is not None:  # (a frozen dataclass's raises, as eager does)
            self._call_slot(tx, "__setattr__", setattr_fn, [ConstantVariable(name), value])
            return
        self.object_setattr(tx, name, value)

    def object_setattr(self, tx, name: str, value: VariableTracker) -> None:
        """``object.__setattr__(obj, name, value)``: a property's setter runs first (a
        record class whose ``__init__`` assigns through a property), else the instance
        dict."""
        from .attributes import data_descriptor_setter, store_through_descriptor

        if store_through_descriptor(tx, self, self.cls, name, value):
            return
        setter = data_descriptor_setter(self.cls, name)
        if is_slot_of(self.cls, name, setter):
            self._guard_slot(tx, name, setter)
            self.slots[name] = value
            return
        if setter is not MISSING_ATTR:
            # (object.__setattr__ would call it: an instance entry would be wrong)
            raise Unsupported(f"setting {name!r} of a {self.cls.__qualname__} through a "
                              "data descriptor that is not Python code")
        if not self.cls.__dictoffset__:  # __slots__ all the way: no instance dict
            raise_traced(AttributeError, f"{self.cls.__name__!r} object has no attribute "
                                         f"{name!r}")
        self.attrs[name] = value

    def _guard_slot(self, tx, name: str, member: Any) -> None:
        upper.guard_class_member(tx, self.cls, name, member)

    def read_slot(self, tx, name: str, member: Any) -> VariableTracker:
        """``obj.name`` through the ``__slots__`` member ``member``."""
        self._guard_slot(tx, name, member)
        value = self.slots.get(name)
        if value is None:
            raise_traced(AttributeError, f"'{self.cls.__name__}' object has no attribute "
                                         f"'{name}'")
        return value

    def delete_attr(self, tx, name: str) -> None:
        from .attributes import data_descriptor_setter

        if self._python_slot("__delattr__") is not None:
            raise Unsupported(f"deleting {name!r} on a {self.cls.__qualname__} "
                              "(custom __delattr__)")
        setter = data_descriptor_setter(self.cls, name)
        if is_slot_of(self.cls, name, setter):
            self._guard_slot(tx, name, setter)
            if name not in self.slots:
                raise Unsupported(f"AttributeError: deleting unset slot {name!r}")
            del self.slots[name]
            return
        if setter is not MISSING_ATTR:
            raise Unsupported(f"deleting {name!r} of a {self.cls.__qualname__} through a "
                              "data descriptor")
        if name not in self.attrs:
            raise Unsupported(f"AttributeError: deleting missing attribute {name!r}")
        del self.attrs[name]

    def force_store_attr(self, name: str, value: VariableTracker) -> None:
        """``object.__setattr__(obj, name, value)`` (frozen dataclasses' __init__)."""
        self.attrs[name] = value

    def reconstruct(self, codegen):
        codegen.push_null()
        codegen.load_const_object(new_object)
        codegen.load_const_object(self.cls)
        for k, v in self.attrs.items():
            codegen.load_const(k)
            codegen(v)
        codegen.build_map(len(self.attrs))
        if not self.slots:
            codegen.call_function(2)
            return
        for k, v in self.slots.items():
            codegen.load_const(k)
            codegen(v)
        codegen.build_map(len(self.slots))
        codegen.call_function(3)


class FrameObjectSlotVariable(BoundMethodVariable):
    """``object.__getattribute__``/``__setattr__``/``__delattr__`` bound to a
    FrameObjectVariable: the generic attribute protocol, under any Python override."""

    def describe(self) -> str:
        return f"object.{self.name} of {self.obj.describe()}"

    def call_function(self, tx, args, kwargs):
        n_args = {"__getattribute__": 1, "__setattr__": 2, "__delattr__": 1}[self.name]
        if kwargs or len(args) != n_args:
            raise Unsupported(f"object.{self.name} with {len(args)} arguments")
        try:
            name = args[0].as_python_constant()
        except NotConstant:
            raise Unsupported(f"object.{self.name} with a non-constant name") from None
        if not isinstance(name, str):
            raise Unsupported(f"object.{self.name} with a {type(name).__name__} name")
        if self.name == "__getattribute__":
            from .attributes import object_getattribute

            return object_getattribute(self.obj).call_function(tx, [args[0]], {})
        if self.name == "__setattr__":
            self.obj.object_setattr(tx, name, args[1])
        else:
            if name not in self.obj.attrs:
                raise Unsupported(f"AttributeError: deleting missing attribute {name!r}")
            del self.obj.attrs[name]
        return ConstantVariable(None)


class ObjectSetattrVariable(VariableTracker):
    """``object.__setattr__`` (what a frozen dataclass's ``__init__`` calls)."""

    def call_function(self, tx, args, kwargs):
        if kwargs or len(args) != 3 or not isinstance(args[0], FrameObjectVariable):
            raise Unsupported("object.__setattr__ on an object from outside the frame")
        try:
            name = args[1].as_python_constant()
        except NotConstant:
            raise Unsupported("object.__setattr__ with a non-constant name") from None
        args[0].object_setattr(tx, name, args[2])
        return ConstantVariable(None)

