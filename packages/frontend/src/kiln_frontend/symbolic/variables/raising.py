"""Raising in the traced program: ``raise_traced(KeyError, k)``, from any tracker.

A tracker raises what eager would raise there (a missing key, an index out of range, an
error of an operation folded on constants): caught by a traced ``except``, else a graph
break (``TracedException`` is ``Unsupported``).  Every tracker needs it, so it lives just
above ``constant``; the exception tracker it raises, ``exceptions.ExceptionVariable`` (a
frame-object tracker, layers higher), is reached through ``upper``."""

from __future__ import annotations

import builtins
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from .base import VariableTracker
from .constant import ConstantVariable, is_constant_value


def is_builtin_exception(cls: Any) -> bool:
    """A class of ``builtins`` deriving from ``Exception`` (their ``__init__`` only stores
    ``args``: nothing to trace)."""
    return isinstance(cls, type) and issubclass(cls, Exception) and \
        getattr(builtins, cls.__name__, None) is cls


class TracedException(Unsupported):
    """A traced ``raise`` on its way to a handler; uncaught, a graph break."""

    def __init__(self, exc: VariableTracker):  # an exceptions.ExceptionVariable
        self.exc = exc
        super().__init__(f"{exc.cls.__name__} raised in captured code and not caught there")


def raise_traced(cls: type, *args: Any) -> None:
    """Raise ``cls(*args)`` (constants) as the traced code would (caught by a traced
    ``except``, else a graph break)."""
    raise TracedException(upper.ExceptionVariable(cls, [ConstantVariable.create(a) for a in args]))


#: what an operation on constants may raise in the traced code: errors about the values
#: (a TypeError may come from how a tracker stands for its value: a graph break instead)
_RAISED_IN_TRACE = (ArithmeticError, LookupError, ValueError, StopIteration)


def raise_traced_from(error: BaseException, what: str) -> None:
    """An operation run on trace-time constants raised ``error``: eager raises the same
    there, so raise it in the traced code (``raise_traced``); an exception of a class
    that is not a builtin is a graph break naming ``what``."""
    if isinstance(error, _RAISED_IN_TRACE) and is_builtin_exception(type(error)) and \
            all(is_constant_value(a) for a in error.args):
        raise_traced(type(error), *error.args)
    raise Unsupported(f"{what} raised {type(error).__name__}: {error}") from error
