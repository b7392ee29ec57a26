"""``copy.deepcopy(x)`` / ``copy.copy(x)`` while tracing (issue 10: transformers deep-copies
its configs inside ``forward``).

The copy is built from trackers, not by running ``copy``'s Python (a memo keyed by ``id``,
``__reduce_ex__``, dispatch tables): constants are themselves, tuples/lists/dicts are new
containers of copies, and a plain Python object (one that ``copy`` would rebuild with
``cls.__new__`` and its ``__dict__``) becomes a new ``FrameObjectVariable`` whose attributes
are copies.  The original's state is read through its source, so each value copied is
guarded (its ``__dict__`` keys by DICT_KEYS, each value as it is wrapped).  Tensors, modules
and objects with their own copy protocol (``__deepcopy__``, ``__reduce__``, a copyreg entry,
``__slots__``, ``__getstate__``/``__setstate__``) are a graph break.
"""

from __future__ import annotations

import copy
import copyreg
from typing import Any

from ...exc import Unsupported
from ...sources import AttrSource
from .base import KnownCallableVariable, VariableTracker

#: Python functions traced by what they mean (consulted by the VariableBuilder)
PYTHON_FUNCTION_HANDLERS: dict[Any, Any] = {}


def register_python_function(fn: Any, handler: Any) -> None:
    if fn in PYTHON_FUNCTION_HANDLERS:
        raise ValueError(f"handler for {fn!r} already registered")
    PYTHON_FUNCTION_HANDLERS[fn] = handler


def copies_by_dict(cls: type) -> bool:
    """``copy`` rebuilds instances of ``cls`` as ``cls.__new__(cls)`` + ``__dict__.update``."""
    if cls in copy._deepcopy_dispatch or cls in copyreg.dispatch_table:
        return False
    if getattr(cls, "__deepcopy__", None) is not None or \
            getattr(cls, "__copy__", None) is not None:
        return False
    if cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__:
        return False
    if getattr(cls, "__getstate__", object.__getstate__) is not object.__getstate__ or \
            hasattr(cls, "__setstate__"):
        return False
    if cls.__new__ is not object.__new__:
        return False
    return not any(k.__dict__.get("__slots__") for k in cls.__mro__[:-1]) and \
        type(cls) in (type, __import__("abc").ABCMeta)


class _Copier:
    def __init__(self, tx, deep: bool):
        self.tx = tx
        self.deep = deep
        #: id(tracker) -> its copy (shared structure stays shared, as copy's memo keeps it)
        self.memo: dict[int, VariableTracker] = {}

    def item(self, v: VariableTracker) -> VariableTracker:
        return self(v) if self.deep else v

    def _clonable_tensor(self, v: VariableTracker) -> bool:
        """A plain strided tensor without grad whose real object (an input's, when it has
        a source) carries no Python attributes a deep copy would copy too."""
        if not _is_plain_tensor_variable(v):
            return False
        if v.source is None:
            return True  # made in the frame: no attributes set on it while tracing
        real = next((r for node, _src, r in self.tx.output.graph_inputs
                     if node is v.proxy.node), None)
        if real is None or real.__dict__:
            return False
        from ...guards import Guard, GuardKind

        # (and it stays so: a later call's tensor with attributes recompiles)
        self.tx.output.guards.add(Guard(AttrSource(v.source, "__dict__"), GuardKind.DICT_KEYS,
                                        (dict, ()), "a deep-copied tensor has no attributes"))
        return True

    def __call__(self, v: VariableTracker) -> VariableTracker:
        from .constant import ConstantVariable
        from .containers import ConstDictVariable, ListVariable, TupleVariable, has_identity_keys
        from .misc import FrameObjectVariable, UserDefinedObjectVariable

        v = self.tx.realize(v)
        hit = self.memo.get(id(v))
        if hit is not None:
            return hit
        if isinstance(v, ConstantVariable):
            return v  # immutable
        if type(v) is TupleVariable:
            out: VariableTracker = TupleVariable([self.item(x) for x in v.items],
                                                 tuple_cls=v.tuple_cls)
        elif type(v) is ListVariable:
            out = ListVariable([])
            self.memo[id(v)] = out
            out.items.extend(self.item(x) for x in v.items)
        elif type(v) is ConstDictVariable and v.dict_cls in (dict, __import__(
                "collections").OrderedDict) and not has_identity_keys(v.items):
            # (a module key would be deep-copied too)
            out = ConstDictVariable({}, dict_cls=v.dict_cls)
            self.memo[id(v)] = out
            out.items.update((k, self.item(x)) for k, x in v.items.items())
        elif type(v) is FrameObjectVariable and copies_by_dict(v.cls):
            out = FrameObjectVariable(v.cls)
            self.memo[id(v)] = out
            out.attrs.update((k, self.item(x)) for k, x in v.attrs.items())
        elif type(v) is UserDefinedObjectVariable and v.source is not None and \
                copies_by_dict(type(v.value)):
            state = self.tx.wrap_value(v.value.__dict__, AttrSource(v.source, "__dict__"))
            state = self.tx.realize(state)
            if type(state) is not ConstDictVariable:
                raise Unsupported(f"copy of a {type(v.value).__qualname__} whose __dict__ is "
                                  f"{state.describe()}")
            out = FrameObjectVariable(type(v.value))
            self.memo[id(v)] = out
            out.attrs.update((k, self.item(x)) for k, x in state.items.items())
        elif self.deep and self._clonable_tensor(v):
            # Tensor.__deepcopy__ of a plain tensor that needs no grad is a clone (new
            # storage, same values, strides and dtype): dataclasses.asdict/astuple do this
            out = self.tx.realize(v.call_method(self.tx, "clone", [], {}))
        else:
            what = "deepcopy" if self.deep else "copy"
            raise Unsupported(f"copy.{what} of {v.describe()}")
        self.memo[id(v)] = out
        return out


def _is_plain_tensor_variable(v: VariableTracker) -> bool:
    import torch

    from .tensor import TensorVariable

    return isinstance(v, TensorVariable) and v.class_type in (None, torch.Tensor) and \
        not v.example_value.requires_grad and v.example_value.layout == torch.strided


def _deepcopy(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.deepcopy with a memo")
    return _Copier(tx, deep=True)(args[0])


def _copy(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("copy.copy with more than one argument")
    return _Copier(tx, deep=False)(args[0])


register_python_function(copy.deepcopy, _deepcopy)
register_python_function(copy.copy, _copy)


class HandledFunctionVariable(KnownCallableVariable):
    """A Python function with an entry in ``PYTHON_FUNCTION_HANDLERS``."""

    @classmethod
    def wrap(cls, builder, value):
        builder.install_identity_guard(value, what="function")
        return cls(value, source=builder.source)

    def call_function(self, tx, args, kwargs):
        return PYTHON_FUNCTION_HANDLERS[self.fn](tx, list(args), dict(kwargs))

    def describe(self) -> str:
        return f"HandledFunctionVariable({self.fn.__module__}.{self.fn.__qualname__})"


class HandledMethodVariable(VariableTracker):
    """``types.MethodType(fn, obj)`` of a handled function: calls go to its handler with
    ``obj`` first (``ExitStack`` binds a manager's ``__exit__`` so)."""

    def __init__(self, fn: HandledFunctionVariable, obj: VariableTracker):
        super().__init__()
        self.fn = fn
        self.obj = obj

    def children(self):
        return [self.fn, self.obj]

    def call_function(self, tx, args, kwargs):
        return self.fn.call_function(tx, [self.obj, *args], kwargs)

    def python_type(self) -> type:
        import types

        return types.MethodType

    def reconstruct(self, codegen):
        import types

        codegen.push_null()
        codegen.load_const_object(types.MethodType)
        codegen(self.fn)
        codegen(self.obj)
        codegen.call_function(2)

    def describe(self) -> str:
        return f"HandledMethodVariable({self.fn.describe()} of {self.obj.describe()})"
