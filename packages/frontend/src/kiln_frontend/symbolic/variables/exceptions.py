"""Exceptions raised and caught inside captured code (issue 10).

``raise ValueError(...)`` inside a ``try`` whose ``except`` is in the same traced code (the
frame, or a function inlined into it) jumps to the handler, as Python does: the exception
is an ``ExceptionVariable`` and ``TracedException`` carries it up through inlined calls to
the nearest exception-table entry (``InstructionTranslatorBase.step``).  An exception that no
traced handler catches is an ordinary graph break (``TracedException`` is ``Unsupported``):
the raise then happens in Python."""

from __future__ import annotations

import builtins
import types
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from .base import NotConstant, VariableTracker
from .raising import is_builtin_exception


def _frame_object_base():
    from .misc import FrameObjectVariable

    return FrameObjectVariable


@upper.provide
class ExceptionVariable(_frame_object_base()):
    """An exception object made while tracing: its class (a builtin one, or a user class
    of plain Python deriving from one), ``args``, instance attributes (a user ``__init__``
    is inlined on it), ``__cause__``/``__context__``/``__suppress_context__``."""

    def __init__(self, cls: type, args: list[VariableTracker]):
        super().__init__(cls)
        self.args = list(args)
        self.cause: ExceptionVariable | None = None
        self.context: ExceptionVariable | None = None
        self.suppress_context = False
        #: False while a user ``__init__`` runs on it (see ``store_attr``)
        self.initialized = True

    @classmethod
    def construct(cls, tx, exc_cls: type, args, kwargs) -> ExceptionVariable:
        import inspect

        init = inspect.getattr_static(exc_cls, "__init__")
        var = cls(exc_cls, list(args))
        if isinstance(init, types.FunctionType):  # a user __init__: inlined on the object
            var.initialized = False
            result = tx.call_function(upper.method_of_pinned_class(tx, exc_cls, "__init__", init,
                                                             var), list(args), dict(kwargs))
            if not (result.is_python_constant() and result.as_python_constant() is None):
                raise Unsupported(f"{exc_cls.__qualname__}.__init__ returned a value")
            var.initialized = True
        elif kwargs:
            raise Unsupported(f"{exc_cls.__name__}() with keyword arguments")
        return var

    def children(self):
        return [*self.args, *self.attrs.values(),
                *(e for e in (self.cause, self.context) if e is not None)]

    def builtin_method(self, tx, name: str) -> VariableTracker:
        """``BaseException.__init__`` reached through ``super()``: sets ``args``."""
        if name == "__init__":
            return _ExceptionInit(self)
        return super().builtin_method(tx, name)

    _SPECIAL = ("args", "__cause__", "__context__", "__suppress_context__", "__traceback__",
                "__class__")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .constant import ConstantVariable
        from .containers import TupleVariable

        if name not in self._SPECIAL:
            return super().var_getattr(tx, name)
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "__class__":
            from .misc import wrap_class

            return wrap_class(self.cls)
        if name == "__suppress_context__":
            return ConstantVariable(self.suppress_context)
        if name == "__traceback__":
            raise Unsupported("the traceback of an exception raised while tracing")
        linked = self.cause if name == "__cause__" else self.context
        return linked if linked is not None else ConstantVariable(None)

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        if name in self._SPECIAL:
            raise Unsupported(f"setting {name!r} of an exception made while tracing")
        if self.initialized and self.cls.__setattr__ is BaseException.__setattr__ and \
                type(self.cls).__setattr__ is type.__setattr__:
            # (BaseException's slot is the generic setattr, in C: a property's setter, then
            # the instance dict; a C member such as OSError.errno is refused there.  A store
            # inside the class's own __init__ still breaks the graph, as torch.compile's
            # does: capturing those makes 1 graph where it makes 0, and the escaping form
            # of such an exception 0 graphs where it makes 1)
            self.object_setattr(tx, name, value)
            return
        if not self.initialized and not isinstance(self.cls.__setattr__, types.FunctionType):
            # the same break on 3.13, where BaseException has no __setattr__ slot of its own
            # (object's is inherited, which the generic store below would trace)
            raise Unsupported(f"setting {name!r} inside {self.cls.__qualname__}.__init__ "
                              "(a C __setattr__ on an exception being constructed)")
        super().store_attr(tx, name, value)

    def str_value(self) -> str:
        """``str(exc)`` when its class's ``__str__`` is BaseException's and the args are
        constants."""
        if self.cls.__str__ is not BaseException.__str__ and \
                getattr(builtins, self.cls.__name__, None) is not self.cls:
            raise Unsupported(f"str() of a {self.cls.__qualname__} (custom __str__)")
        try:
            values = [a.as_python_constant() for a in self.args]
        except NotConstant:
            raise Unsupported("str() of an exception with non-constant args") from None
        return str(BaseException(*values)) if self.cls is not KeyError else \
            str(KeyError(*values))

    def repr_value(self) -> str:
        """``repr(exc)`` when its class's ``__repr__`` is BaseException's (its name and
        constant args)."""
        if self.cls.__repr__ is not BaseException.__repr__:
            raise Unsupported(f"repr() of a {self.cls.__qualname__} (custom __repr__)")
        try:
            values = [a.as_python_constant() for a in self.args]
        except NotConstant:
            raise Unsupported("repr() of an exception with non-constant args") from None
        return self.cls.__name__ + repr(BaseException(*values))[len("BaseException"):]

    def reconstruct(self, codegen):
        if self.cause is not None or self.context is not None or \
                getattr(builtins, self.cls.__name__, None) is not self.cls or self.attrs:
            codegen.push_null()
            codegen.load_const_object(rebuild_exception)
            codegen.load_const_object(self.cls)
            for a in self.args:
                codegen(a)
            codegen.build_tuple(len(self.args))
            for k, v in self.attrs.items():
                codegen.load_const(k)
                codegen(v)
            codegen.build_map(len(self.attrs))
            codegen.call_function(3)
            return
        codegen.push_null()
        codegen.load_const_object(self.cls)
        for a in self.args:
            codegen(a)
        codegen.call_function(len(self.args))

    def describe(self) -> str:
        return f"ExceptionVariable({self.cls.__name__})"


class _ExceptionInit(VariableTracker):
    def __init__(self, exc: ExceptionVariable):
        super().__init__()
        self.exc = exc

    def call_function(self, tx, args, kwargs):
        from .constant import ConstantVariable

        if kwargs:
            raise Unsupported("BaseException.__init__ with keyword arguments")
        self.exc.args = list(args)
        return ConstantVariable(None)


def rebuild_exception(cls: type, args: tuple, attrs: dict) -> BaseException:
    """What generated code calls to rebuild an exception made while tracing (no
    ``__init__`` re-run: its attributes are set as traced)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


def is_user_exception(cls: Any) -> bool:
    """A user class deriving from a builtin exception, plain enough to build while tracing:
    default metaclass and ``__new__``, no ``__slots__``, no C ``__init__`` but
    BaseException's, no ``__setattr__``."""
    if not isinstance(cls, type) or not issubclass(cls, Exception) or type(cls) is not type:
        return False
    if cls.__setattr__ is not BaseException.__setattr__:
        return False
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            if not is_builtin_exception(klass) and klass not in (BaseException, object):
                return False
            continue
        if "__slots__" in klass.__dict__ or "__new__" in klass.__dict__ or \
                klass.__module__.split(".")[0] == "torch":
            return False
    return True


def is_traced_exception_class(cls: Any) -> bool:
    """Exceptions built while tracing: builtin ones and plain user subclasses."""
    return is_builtin_exception(cls) or is_user_exception(cls)


def as_exception(tx, value) -> ExceptionVariable:
    """What ``raise value`` / ``gen.throw(value)`` raises: an exception tracker, or a
    traced exception class called with no arguments."""
    value = tx.realize(value)
    if isinstance(value, ExceptionVariable):
        return value
    try:
        cls = value.as_python_constant()
    except Exception:  # noqa: BLE001 - not a class known at trace time
        cls = None
    if is_traced_exception_class(cls):  # ``raise ValueError``
        return ExceptionVariable.construct(tx, cls, [], {})
    raise Unsupported(f"raising {value.describe()} in captured code")


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
