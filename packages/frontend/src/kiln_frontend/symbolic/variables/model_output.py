"""Dataclasses that are also ordered dicts of their non-None fields: transformers'
``ModelOutput`` (every Hugging Face model returns one).

Their ``__init__``/``__post_init__``/``__setattr__`` are too dynamic to inline, so this
tracker implements the behaviour directly: the fields are trackers, the dict items are the
fields that are not None (in field order), ``out[i]`` indexes ``to_tuple()``, ``out["k"]``
the dict.  Generated code rebuilds one with ``cls(**non_none_fields)`` (the real
constructor).  The class is recognised by its MRO (``transformers.utils.generic
.ModelOutput``), without importing transformers."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from .base import BoundMethodVariable, NotConstant, VariableTracker, constant_or_break
from .constant import ConstantVariable


def is_model_output_class(cls: Any) -> bool:
    generic = sys.modules.get("transformers.utils.generic")
    base = getattr(generic, "ModelOutput", None)
    return (base is not None and isinstance(cls, type) and issubclass(cls, base)
            and cls is not base and dataclasses.is_dataclass(cls))


def _is_none(v: VariableTracker | None) -> bool:
    return v is None or (v.is_python_constant() and v.as_python_constant() is None)


class ModelOutputVariable(VariableTracker):
    mutable = True

    def __init__(self, cls: type, fields: dict[str, VariableTracker]):
        super().__init__()
        self.cls = cls
        self.fields = dict(fields)

    @classmethod
    def construct(cls, tx, klass: type, args, kwargs) -> ModelOutputVariable:
        import inspect

        from .tensor import TensorVariable

        names = [f.name for f in dataclasses.fields(klass)]
        try:
            bound = inspect.signature(klass).bind(*args, **kwargs)
        except TypeError as e:
            raise Unsupported(f"{klass.__qualname__}(): {e}") from None
        values = {n: bound.arguments.get(n, ConstantVariable(None)) for n in names}
        first = tx.realize(values[names[0]])
        others_none = all(_is_none(values[n]) for n in names[1:])
        if others_none and not isinstance(first, TensorVariable) and not _is_none(first):
            raise Unsupported(f"{klass.__qualname__} built from a non-tensor first field")
        return cls(klass, {n: tx.realize(v) for n, v in values.items()})

    def python_type(self) -> type:
        return self.cls

    def children(self):
        return list(self.fields.values())

    def describe(self) -> str:
        return f"ModelOutputVariable({self.cls.__qualname__})"

    # -- the dict view ------------------------------------------------------------------

    def keys(self) -> list[str]:
        return [k for k, v in self.fields.items() if not _is_none(v)]

    def to_tuple(self) -> list[VariableTracker]:
        return [self.fields[k] for k in self.keys()]

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        from .containers import TupleVariable

        idx = constant_or_break(index, "indexing a ModelOutput with a non-constant")
        if isinstance(idx, str):
            if idx not in self.keys():
                raise Unsupported(f"KeyError: {idx!r}")
            return self.fields[idx]
        items = self.to_tuple()
        if isinstance(idx, slice):
            return TupleVariable(items[idx])
        try:
            return items[idx]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"{type(e).__name__} indexing a ModelOutput") from None

    def setitem(self, tx, key: VariableTracker, value: VariableTracker) -> None:
        try:
            k = key.as_python_constant()
        except NotConstant:
            raise Unsupported("ModelOutput key is not a constant") from None
        self.fields[k] = value

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        if name not in self.fields:
            raise Unsupported(f"setting non-field attribute {name!r} on a ModelOutput")
        self.fields[name] = value

    def contains(self, tx, item: VariableTracker) -> VariableTracker:
        try:
            return ConstantVariable(item.as_python_constant() in self.keys())
        except NotConstant:
            raise Unsupported("`in` on a ModelOutput with a non-constant") from None

    def len_value(self, tx) -> int:
        return len(self.keys())

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return [ConstantVariable(k) for k in self.keys()]

    def truth_value(self, tx) -> bool:
        return bool(self.keys())

    def has_attr(self, tx, name: str) -> bool:
        return name in self.fields or hasattr(self.cls, name)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get"):
            return ModelOutputMethodVariable(self, name)
        if name == "__class__":
            return upper.wrap_class(self.cls)
        raise Unsupported(f"attribute {name!r} of {self.cls.__qualname__}")

    def reconstruct(self, codegen):
        # new_model_output(cls, {field: value}) -- no __init__ frame for the hook to see
        codegen.push_null()
        codegen.load_const_object(new_model_output)
        codegen.load_const_object(self.cls)
        for k, v in self.fields.items():
            codegen.load_const(k)
            codegen(v)
        codegen.build_map(len(self.fields))
        codegen.call_function(2)


def new_model_output(cls: type, fields: dict[str, Any]) -> Any:
    """What ``cls(**fields)`` builds (dict items: the non-None fields, in order;
    attributes: every field), made without running Python ``__init__`` code."""
    import collections

    obj = cls.__new__(cls)
    collections.OrderedDict.__init__(obj)
    for k, v in fields.items():
        if v is not None:
            collections.OrderedDict.__setitem__(obj, k, v)
    obj.__dict__.update(fields)
    return obj


class ModelOutputMethodVariable(BoundMethodVariable):
    def call_function(self, tx, args, kwargs):
        from .containers import ListIteratorVariable, TupleVariable

        obj = self.obj
        if kwargs:
            raise Unsupported(f"ModelOutput.{self.name} with keyword arguments")
        if self.name == "to_tuple" and not args:
            return TupleVariable(obj.to_tuple())
        if self.name == "keys" and not args:
            return ListIteratorVariable([ConstantVariable(k) for k in obj.keys()])
        if self.name == "values" and not args:
            return ListIteratorVariable(obj.to_tuple())
        if self.name == "items" and not args:
            return ListIteratorVariable([TupleVariable([ConstantVariable(k), obj.fields[k]])
                                         for k in obj.keys()])
        if self.name == "get" and 1 <= len(args) <= 2:
            found = obj.contains(tx, args[0]).as_python_constant()
            if found:
                return obj.getitem(tx, args[0])
            return args[1] if len(args) == 2 else ConstantVariable(None)
        raise Unsupported(f"ModelOutput.{self.name} with these arguments")
