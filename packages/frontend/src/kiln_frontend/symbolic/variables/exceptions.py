"""Exceptions raised and caught inside captured code (issue 10).

``raise ValueError(...)`` inside a ``try`` whose ``except`` is in the same traced code (the
frame, or a function inlined into it) jumps to the handler, as Python does: the exception
is an ``ExceptionVariable`` and ``TracedException`` carries it up through inlined calls to
the nearest exception-table entry (``InstructionTranslatorBase.step``).  An exception that no
traced handler catches is an ordinary graph break (``TracedException`` is ``Unsupported``):
the raise then happens in Python."""

from __future__ import annotations

import builtins
from typing import Any

from ...exc import Unsupported
from .base import NotConstant, VariableTracker


class ExceptionVariable(VariableTracker):
    """An exception object made while tracing: a builtin exception class and its args."""

    def __init__(self, cls: type, args: list[VariableTracker]):
        super().__init__()
        self.cls = cls
        self.args = list(args)

    @classmethod
    def construct(cls, tx, exc_cls: type, args, kwargs) -> ExceptionVariable:
        if kwargs:
            raise Unsupported(f"{exc_cls.__name__}() with keyword arguments")
        return cls(exc_cls, list(args))

    def python_type(self) -> type:
        return self.cls

    def children(self):
        return list(self.args)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .containers import TupleVariable

        if name == "args":
            return TupleVariable(list(self.args))
        if name == "__class__":
            from .misc import wrap_class

            return wrap_class(self.cls)
        raise Unsupported(f"attribute {name!r} of an exception made while tracing")

    def reconstruct(self, codegen):
        codegen.push_null()
        codegen.load_const_object(self.cls)
        for a in self.args:
            codegen(a)
        codegen.call_function(len(self.args))

    def describe(self) -> str:
        return f"ExceptionVariable({self.cls.__name__})"


def is_builtin_exception(cls: Any) -> bool:
    """A class of ``builtins`` deriving from ``Exception`` (their ``__init__`` only stores
    ``args``: nothing to trace)."""
    return isinstance(cls, type) and issubclass(cls, Exception) and \
        getattr(builtins, cls.__name__, None) is cls


class TracedException(Unsupported):
    """A traced ``raise`` on its way to a handler; uncaught, a graph break."""

    def __init__(self, exc: ExceptionVariable):
        self.exc = exc
        super().__init__(f"{exc.cls.__name__} raised in captured code and not caught there")


def raise_traced(cls: type, *args: Any) -> None:
    """Raise ``cls(*args)`` (constants) as the traced code would (caught by a traced
    ``except``, else a graph break)."""
    from .constant import ConstantVariable

    raise TracedException(ExceptionVariable(cls, [ConstantVariable.create(a) for a in args]))


#: what an operation on constants may raise in the traced code: errors about the values
#: (a TypeError may come from how a tracker stands for its value: a graph break instead)
_RAISED_IN_TRACE = (ArithmeticError, LookupError, ValueError, StopIteration)


def raise_traced_from(error: BaseException, what: str) -> None:
    """An operation run on trace-time constants raised ``error``: eager raises the same
    there, so raise it in the traced code (``raise_traced``); an exception of a class
    that is not a builtin is a graph break naming ``what``."""
    from .constant import is_constant_value

    if isinstance(error, _RAISED_IN_TRACE) and is_builtin_exception(type(error)) and \
            all(is_constant_value(a) for a in error.args):
        raise_traced(type(error), *error.args)
    raise Unsupported(f"{what} raised {type(error).__name__}: {error}") from error


def exception_matches(exc: VariableTracker, match: VariableTracker) -> bool:
    """``except <match>:`` for ``exc`` (a class or a tuple of classes)."""
    try:
        classes = match.as_python_constant()
    except NotConstant:
        raise Unsupported("`except` with a non-constant class") from None
    if not isinstance(exc, ExceptionVariable):
        raise Unsupported(f"`except` on {exc.describe()}")
    try:
        return issubclass(exc.cls, classes)
    except TypeError as e:
        raise Unsupported(f"`except` with {classes!r}: {e}") from None
