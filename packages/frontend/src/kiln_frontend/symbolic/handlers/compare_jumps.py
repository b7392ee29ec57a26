"""Comparisons, identity and membership tests, jumps, and unrolled for-loops."""

from __future__ import annotations

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
    tx.push(call_operator(tx, op, [left, right], {}))


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


POP_JUMP_IF_TRUE = handler("POP_JUMP_IF_TRUE", versions=(3, 12))(_pop_jump(True))
POP_JUMP_IF_FALSE = handler("POP_JUMP_IF_FALSE", versions=(3, 12))(_pop_jump(False))
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


POP_JUMP_IF_NONE = handler("POP_JUMP_IF_NONE", versions=(3, 12))(_pop_jump_none(True))
POP_JUMP_IF_NOT_NONE = handler("POP_JUMP_IF_NOT_NONE", versions=(3, 12))(
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


@handler("FOR_ITER", versions=(3, 12))
def FOR_ITER_312(tx, inst):
    item = _next(tx)
    if item is None:
        # 3.12: the iterator is popped and END_FOR (the jump target) is skipped
        tx.pop()
        tx.jump(inst)
        tx.ip += 1
    else:
        tx.push(item)


@handler("END_FOR", versions=(3, 12))
def END_FOR(tx, inst):
    tx.popn(2)
