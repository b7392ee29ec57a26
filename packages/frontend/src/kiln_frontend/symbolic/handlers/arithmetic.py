"""Binary and unary operators: folded on constants, graph nodes on tensors."""

from __future__ import annotations

import operator

from ...bytecode import versions
from ...exc import Unsupported
from ..registry import handler
from ..variables.constant import BINARY_OPERATORS
from ..variables.operators import call_operator


@handler("BINARY_OP")
def BINARY_OP(tx, inst):
    right = tx.realize(tx.pop())
    left = tx.realize(tx.pop())
    symbol = versions.BINARY_OPS[inst.arg]
    fn = BINARY_OPERATORS.get(symbol)
    if fn is None:
        raise Unsupported(f"binary operator {symbol!r}")
    tx.push(call_operator(tx, fn, [left, right], {}))


def _unary(fn):
    def h(tx, inst):
        tx.push(call_operator(tx, fn, [tx.realize(tx.pop())], {}))

    return h


UNARY_NEGATIVE = handler("UNARY_NEGATIVE")(_unary(operator.neg))
UNARY_INVERT = handler("UNARY_INVERT")(_unary(operator.invert))
UNARY_NOT = handler("UNARY_NOT")(_unary(operator.not_))
UNARY_POSITIVE = handler("UNARY_POSITIVE", versions=(3, 11))(_unary(operator.pos))
