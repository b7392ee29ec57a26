"""Comparisons, identity and membership tests, jumps, and unrolled for-loops."""

from __future__ import annotations

from ...bytecode import versions
from ...exc import Unsupported
from ..registry import handler
from ..variables import ConstantVariable
from ..variables.constant import COMPARE_OPERATORS
from ..variables.containers import IteratorVariable
from ..variables.operators import call_operator, contains_op, is_op


@handler("COMPARE_OP")
def COMPARE_OP(tx, inst):
    right = tx.realize(tx.pop())
    left = tx.realize(tx.pop())
    op = COMPARE_OPERATORS.get(inst.argval)
    if op is None:
        raise Unsupported(f"comparison {inst.argval!r}")
    result = call_operator(tx, op, [left, right], {})
    if versions.compare_to_bool(inst.arg):  # 3.13: ``bool(left < right)``
        result = _to_bool(tx, inst, result)
    tx.push(result)


@handler("TO_BOOL", versions=(3, 13))
def TO_BOOL(tx, inst):
    tx.push(_to_bool(tx, inst, tx.pop()))


#: jumps that take TO_BOOL's result (and compute truth themselves while tracing)
_TRUTH_JUMPS = frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"})


def _to_bool(tx, inst, value):
    """3.13's ``bool(value)`` (TO_BOOL, COMPARE_OP's bool bit).  Before a POP_JUMP_IF_TRUE/
    FALSE the value stays as it is: the jump takes its truth, or breaks the graph with the
    value on the stack (the resume code converts it again).  Elsewhere (``not x``) the truth is
    taken now; one that cannot be traced breaks the graph at this instruction, which then runs
    in Python."""
    value = tx.realize(value)
    following = tx.instructions[tx.ip] if tx.ip < len(tx.instructions) else None
    if following is not None and following.opname in _TRUTH_JUMPS:
        return value
    return ConstantVariable(value.truth_value(tx))


@handler("IS_OP")
def IS_OP(tx, inst):
    right = tx.realize(tx.pop())
    left = tx.realize(tx.pop())
    tx.push(is_op(tx, left, right, negate=bool(inst.arg)))


@handler("CONTAINS_OP")
def CONTAINS_OP(tx, inst):
    container = tx.realize(tx.pop())
    item = tx.realize(tx.pop())
    result = contains_op(tx, container, item)
    if inst.arg:
        result = ConstantVariable(not result.as_python_constant())
    tx.push(result)


def _truth(tx, inst, value):
    value = tx.realize(value)
    try:
        return value.truth_value(tx)
    except Unsupported as e:
        tx.push(value)  # keep the stack as it was before the jump
        tx.graph_break_on_jump(inst, e)
        raise  # graph_break_on_jump always raises


def _pop_jump(expect: bool):
    def fn(tx, inst):
        value = tx.pop()
        if _truth(tx, inst, value) is expect:
            tx.jump(inst)

    return fn


_PY312_ON = ((3, 12), (3, 13))
POP_JUMP_IF_TRUE = handler("POP_JUMP_IF_TRUE", versions=_PY312_ON)(_pop_jump(True))
POP_JUMP_IF_FALSE = handler("POP_JUMP_IF_FALSE", versions=_PY312_ON)(_pop_jump(False))
POP_JUMP_FORWARD_IF_TRUE = handler("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE",
                                   versions=(3, 11))(_pop_jump(True))
POP_JUMP_FORWARD_IF_FALSE = handler("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE",
                                    versions=(3, 11))(_pop_jump(False))


def _is_none(tx, value) -> bool:
    value = tx.realize(value)
    if value.is_python_constant():
        return value.as_python_constant() is None
    # every non-constant tracker stands for an object that is not None
    return False


def _pop_jump_none(expect_none: bool):
    def fn(tx, inst):
        value = tx.pop()
        if _is_none(tx, value) is expect_none:
            tx.jump(inst)

    return fn


POP_JUMP_IF_NONE = handler("POP_JUMP_IF_NONE", versions=_PY312_ON)(_pop_jump_none(True))
POP_JUMP_IF_NOT_NONE = handler("POP_JUMP_IF_NOT_NONE", versions=_PY312_ON)(
    _pop_jump_none(False))
POP_JUMP_FORWARD_IF_NONE = handler("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE",
                                   versions=(3, 11))(_pop_jump_none(True))
POP_JUMP_FORWARD_IF_NOT_NONE = handler("POP_JUMP_FORWARD_IF_NOT_NONE",
                                       "POP_JUMP_BACKWARD_IF_NOT_NONE",
                                       versions=(3, 11))(_pop_jump_none(False))


def _jump_or_pop(expect: bool):
    def fn(tx, inst):
        value = tx.pop()
        if _truth(tx, inst, value) is expect:
            tx.push(value)
            tx.jump(inst)

    return fn


JUMP_IF_TRUE_OR_POP = handler("JUMP_IF_TRUE_OR_POP", versions=(3, 11))(_jump_or_pop(True))
JUMP_IF_FALSE_OR_POP = handler("JUMP_IF_FALSE_OR_POP", versions=(3, 11))(_jump_or_pop(False))


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def JUMP(tx, inst):
    tx.jump(inst)


@handler("GET_ITER")
def GET_ITER(tx, inst):
    tx.push(tx.realize(tx.pop()).iter_var(tx))


def _next(tx):
    it = tx.peek()
    if not isinstance(it, IteratorVariable):
        raise Unsupported(f"iterating over {it.describe()}")
    return it.next_item(tx)


@handler("FOR_ITER", versions=(3, 11))
def FOR_ITER_311(tx, inst):
    item = _next(tx)
    if item is None:
        tx.pop()
        tx.jump(inst)
    else:
        tx.push(item)


@handler("FOR_ITER", versions=_PY312_ON)
def FOR_ITER_312(tx, inst):
    item = _next(tx)
    if item is None:
        # 3.12+: the iterator is popped and END_FOR at the jump target is skipped (3.13:
        # END_FOR and the POP_TOP after it)
        tx.pop()
        tx.jump(inst)
        tx.ip += len(versions.FOR_ITER_SKIPS)
    else:
        tx.push(item)


@handler("END_FOR", versions=(3, 12))
def END_FOR(tx, inst):
    tx.popn(2)


@handler("END_FOR", versions=(3, 13))
def END_FOR_313(tx, inst):
    tx.pop()  # 3.13: a POP_TOP follows it
