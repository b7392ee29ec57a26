"""``raise``, ``try``/``except`` inside captured code: a raise whose handler is in the traced
code jumps there (see variables/exceptions.py); the handler's opcodes keep the exception on
the symbolic stack as CPython keeps it on the real one."""

from __future__ import annotations

import sys

from ...exc import Unsupported
from ...guards import Guard, GuardKind
from ..registry import handler
from ..variables.constant import ConstantVariable, wrap_constant_result
from ..variables.exceptions import (
    ExceptionVariable,
    as_exception,
    exception_matches,
)
from ..variables.raising import TracedException
from ..variables.stdlib import register_builtin
from ..variables.torch import TorchStateSource


def handled_exceptions(tx) -> list[ExceptionVariable]:
    """The exceptions being handled (``sys.exc_info()``'s stack, innermost last): one
    stack for the frame and what it inlines, as CPython keeps one per thread."""
    root = tx.root()
    if not hasattr(root, "handled_exceptions"):
        root.handled_exceptions = []
    return root.handled_exceptions


def _handled_query(name: str):
    """``sys.<name>()`` (``exc_info``, or ``exception``, which 3.13's contextlib.ExitStack
    reads) where no traced ``except``/``finally`` handles an exception: its nothing-handled
    answer, guarded (the frame is entered with no exception being handled, as CPython would
    otherwise answer the caller's). Inside a traced handler it breaks the graph: the exception
    is known, but not the traceback CPython would give."""
    query = getattr(sys, name)

    def handler(tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"sys.{name} with arguments")
        if handled_exceptions(tx):
            raise Unsupported(f"sys.{name}() inside a traced except/finally (no traceback)")
        value = query()  # (the caller's: the tracer runs under it, handling nothing)
        if value not in (None, (None, None, None)):
            raise Unsupported(f"sys.{name}() in a frame entered while handling an exception")
        source = TorchStateSource("sys", name)
        tx.output.guards.add(Guard(source, GuardKind.CONSTANT_MATCH, value, "exception state"))
        return wrap_constant_result(value, what=f"sys.{name}()")

    register_builtin(query, handler)


_handled_query("exc_info")
_handled_query("exception")


@handler("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:  # bare ``raise``: the exception being handled, as it is
        handled = handled_exceptions(tx)
        if not handled:
            raise Unsupported("bare `raise` with no exception being handled")
        raise TracedException(handled[-1])
    cause = None
    if inst.arg == 2:
        cause = tx.realize(tx.pop())
    exc = as_exception(tx, tx.pop())
    if cause is not None:  # ``raise X from Y`` (``from None``: no cause, context hidden)
        exc.cause = None if cause.is_python_constant() and \
            cause.as_python_constant() is None else as_exception(tx, cause)
        exc.suppress_context = True
    handled = handled_exceptions(tx)
    if handled and handled[-1] is not exc and exc.context is None:
        exc.context = handled[-1]  # raised while handling another: its __context__
    raise TracedException(exc)


@handler("RERAISE")
def RERAISE(tx, inst):
    exc = tx.pop()  # (with an arg, CPython only peeks at the offset below to set f_lasti)
    raise TracedException(as_exception(tx, exc))


@handler("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    handled = handled_exceptions(tx)
    tx.push(handled[-1] if handled else ConstantVariable(None))  # restored by POP_EXCEPT
    tx.push(exc)
    handled.append(as_exception(tx, exc))


@handler("POP_EXCEPT")
def POP_EXCEPT(tx, inst):
    tx.pop()
    handled = handled_exceptions(tx)
    if handled:
        handled.pop()


@handler("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst):
    match = tx.realize(tx.pop())
    exc = tx.realize(tx.peek())
    tx.push(ConstantVariable(exception_matches(exc, match)))


@handler("WITH_EXCEPT_START")
def WITH_EXCEPT_START(tx, inst):
    """A ``with`` block left by an exception: ``__exit__(type, value, None)`` (inlined for
    Python managers; torch's own restore their mode and never suppress)."""
    from ..variables.misc import wrap_class

    exc = tx.realize(tx.peek())
    exit_fn = tx.peek(4)
    if not isinstance(exc, ExceptionVariable):
        raise Unsupported(f"leaving a `with` block with {exc.describe()}")
    tx.push(tx.call_function(exit_fn, [wrap_class(exc.cls), exc, ConstantVariable(None)],
                             {}))


def handle_traced_exception(tx, inst, error: TracedException) -> bool:
    """Jump to the handler of ``inst`` for ``error`` (True), or leave it to the caller
    (False: no handler in this code).  Any handler: an ``except``/``finally`` body, the
    cleanup that unbinds ``except ... as e``, a ``with`` block's ``__exit__``."""
    entry = getattr(inst, "exn_tab_entry", None)
    if entry is None:
        return False
    if len(tx.stack) < entry.depth:
        return False
    del tx.stack[entry.depth:]
    if entry.lasti:
        tx.push(ConstantVariable(inst.offset if inst.offset is not None else -1))
    tx.push(error.exc)
    tx.ip = tx.index_of[id(entry.target)]
    return True
