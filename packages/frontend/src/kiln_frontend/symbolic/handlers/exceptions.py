"""``raise``, ``try``/``except`` inside captured code: a raise whose handler is in the traced
code jumps there (see variables/exceptions.py); the handler's opcodes keep the exception on
the symbolic stack as CPython keeps it on the real one."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler
from ..variables.constant import ConstantVariable
from ..variables.exceptions import (
    ExceptionVariable,
    TracedException,
    exception_matches,
    is_builtin_exception,
)


def _as_exception(tx, value) -> ExceptionVariable:
    value = tx.realize(value)
    if isinstance(value, ExceptionVariable):
        return value
    try:
        cls = value.as_python_constant()
    except Exception:  # noqa: BLE001 - not a class known at trace time
        cls = None
    if is_builtin_exception(cls):  # ``raise ValueError``
        return ExceptionVariable(cls, [])
    raise Unsupported(f"raising {value.describe()} in captured code")


@handler("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:
        raise Unsupported("bare `raise` in captured code")
    if inst.arg == 2:
        tx.pop()  # the cause of ``raise X from Y``: not observable in the traced code
    raise TracedException(_as_exception(tx, tx.pop()))


@handler("RERAISE")
def RERAISE(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # the offset of the raising instruction (CPython restores f_lasti)
    raise TracedException(_as_exception(tx, exc))


@handler("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    tx.push(ConstantVariable(None))  # the exception handled before (none while tracing)
    tx.push(exc)


@handler("POP_EXCEPT")
def POP_EXCEPT(tx, inst):
    tx.pop()


@handler("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst):
    match = tx.realize(tx.pop())
    exc = tx.realize(tx.peek())
    tx.push(ConstantVariable(exception_matches(exc, match)))


def handle_traced_exception(tx, inst, error: TracedException) -> bool:
    """Jump to the handler of ``inst`` for ``error`` (True), or leave it to the caller
    (False: no handler here, or one that is not a plain ``except``/``finally``)."""
    entry = getattr(inst, "exn_tab_entry", None)
    if entry is None:
        return False
    target = tx.index_of[id(entry.target)]
    following = tx.instructions[target + 1:target + 2]
    if tx.instructions[target].opname != "PUSH_EXC_INFO" or \
            (following and following[0].opname == "WITH_EXCEPT_START"):
        return False  # the cleanup of a ``with`` (its __exit__ would see the exception)
    if len(tx.stack) < entry.depth:
        return False
    del tx.stack[entry.depth:]
    if entry.lasti:
        tx.push(ConstantVariable(inst.offset if inst.offset is not None else -1))
    tx.push(error.exc)
    tx.ip = target
    return True
