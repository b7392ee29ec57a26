"""Python constants: numbers, strings, None, dtypes, devices, sizes, slices, ranges."""

from __future__ import annotations

import enum
import operator
import types
import typing
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from .base import BoundMethodVariable, Codegen, NotConstant, VariableTracker, tracker_for

#: types whose values are immutable and compared by value: safe to fold at trace time
CONSTANT_TYPES: tuple[type, ...] = (
    int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented),
    torch.dtype, torch.device, torch.layout, torch.memory_format, slice, range, torch.Size,
    frozenset, types.CodeType, torch.finfo, torch.iinfo,  # (read-only machine limits)
    typing._SpecialForm,  # typing.Union, Literal, Any...: singletons compared by identity
    enum.Enum,  # members: singletons, hashable (dict keys), guarded by type and identity
)

#: methods of constants that are pure (safe to call at trace time)
_PURE_METHOD_TYPES = (int, float, bool, str, bytes, complex, tuple, torch.Size, range,
                      torch.dtype, torch.device, slice)


def is_constant_value(value: Any) -> bool:
    if isinstance(value, CONSTANT_TYPES) and not isinstance(value, frozenset):
        if isinstance(value, slice):
            return all(is_constant_value(v) for v in (value.start, value.stop, value.step))
        return True
    if type(value) in (tuple, frozenset):
        return all(is_constant_value(v) for v in value)
    return False


def _enum_member(tx, member: ConstantVariable, name: str) -> VariableTracker | None:
    """A Python method or property of an enum class, read through one of its members
    (inlined, guarded on the class's entry)."""
    import inspect

    cls = type(member.value)
    attr = inspect.getattr_static(cls, name, None)
    if isinstance(attr, types.FunctionType):
        return upper.method_of_pinned_class(tx, cls, name, attr, member)
    if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
        return upper.call_property(tx, cls, name, attr, member)
    return None


@tracker_for(*CONSTANT_TYPES)
class ConstantVariable(VariableTracker):
    """A value known at trace time.  Built from a source it is guarded by CONSTANT_MATCH
    (so the compiled code is specialized on it)."""

    def __init__(self, value: Any, *, source=None):
        super().__init__(source=source)
        self.value = value

    @classmethod
    def wrap(cls, builder, value):
        if type(value) in (int, float) and builder.source is not None and builder.guard:
            output = builder.tx.output
            if upper.scalar_is_dynamic(output, builder.source, value):
                # automatic dynamic (shapes.py): a symbol guarded by its type, not its value
                builder.install_guard(GuardKind.TYPE_MATCH, type(value))
                return upper.make_dynamic_scalar(output, builder.source, value)
        builder.install_guard(GuardKind.CONSTANT_MATCH, value)
        return cls(value, source=builder.source)

    @classmethod
    def create(cls, value: Any) -> VariableTracker:
        """A tracker for a constant made during tracing (tuples become TupleVariable)."""
        if type(value) is tuple:
            return upper.TupleVariable([cls.create(v) for v in value])
        if type(value) is list:
            return upper.ListVariable([cls.create(v) for v in value])
        return cls(value)

    def as_python_constant(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def as_proxy(self) -> Any:
        if type(self.value).__module__ == "numpy":  # np.float64 is a float: as the number
            return self.value.item()
        return self.value

    def truth_value(self, tx) -> bool:
        return bool(self.value)

    def has_unpack_var_sequence(self, tx) -> bool:
        return isinstance(self.value, (tuple, range, str, bytes, torch.Size, frozenset))

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        if not self.has_unpack_var_sequence(tx):
            raise Unsupported(f"iterating over {type(self.value).__name__}")
        return [ConstantVariable.create(v) for v in self.value]

    def var_getattr(self, tx, name: str) -> VariableTracker:
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"{type(self.value).__name__} has no attribute {name!r}") from e
        if is_constant_value(attr):
            return ConstantVariable.create(attr)
        if isinstance(self.value, enum.Enum):
            member = _enum_member(tx, self, name)
            if member is not None:
                return member
        if isinstance(self.value, _PURE_METHOD_TYPES) and isinstance(
                attr, (types.BuiltinMethodType, types.MethodWrapperType)):
            return ConstantMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of constant {type(self.value).__name__}")

    def call_method(self, tx, name, args, kwargs):
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def reconstruct(self, codegen: Codegen) -> None:
        codegen.load_const(self.value)

    def describe(self) -> str:
        return f"ConstantVariable({self.value!r})"


def _consumed(tx, arg: VariableTracker) -> VariableTracker:
    """A traced iterator (a generator expression...) given to a method that consumes it
    whole (``str.join``): a tuple of its items, produced in eager's order."""
    arg = tx.realize(arg)
    if isinstance(arg, upper.IteratorVariable):
        return upper.TupleVariable([tx.realize(v) for v in arg.unpack_var_sequence(tx)])
    return arg


class ConstantMethodVariable(BoundMethodVariable):
    """A bound method of a constant (``"a,b".split``), folded when called on constants."""

    def call_function(self, tx, args, kwargs):
        if self.name == "join" and len(args) == 1 and not kwargs:
            args = [_consumed(tx, args[0])]  # ",".join(<generator>): items one by one
        try:
            cargs = [a.as_python_constant() for a in args]
            ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        except NotConstant:
            raise Unsupported(
                f"{type(self.obj.value).__name__}.{self.name} with non-constant arguments"
            ) from None
        result = getattr(self.obj.value, self.name)(*cargs, **ckwargs)
        return wrap_constant_result(result, what=f"{type(self.obj.value).__name__}.{self.name}")

    def reconstruct(self, codegen):
        codegen(self.obj)
        codegen.load_attr(self.name)


def wrap_constant_result(result: Any, *, what: str) -> VariableTracker:
    if type(result) is set and all(is_constant_value(v) for v in result):
        var = upper.SetVariable([ConstantVariable.create(v) for v in result])
        var.shadow = result  # (a new set: its own table, which iteration and pop follow)
        var.resync()
        return var
    if is_constant_value(result) or type(result) in (list, tuple):
        if type(result) in (list, tuple) and not all(is_constant_value(v) for v in result):
            raise Unsupported(f"{what} returned a non-constant")
        return ConstantVariable.create(result)
    raise Unsupported(f"{what} returned a {type(result).__name__}")


#: binary operators on constants, by symbol
BINARY_OPERATORS: dict[str, Any] = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv,
    "<<=": operator.ilshift, "@=": operator.imatmul, "*=": operator.imul,
    "%=": operator.imod, "|=": operator.ior, "**=": operator.ipow, ">>=": operator.irshift,
    "-=": operator.isub, "/=": operator.itruediv, "^=": operator.ixor,
}

COMPARE_OPERATORS: dict[str, Any] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge,
}
