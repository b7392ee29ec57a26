"""Returning from the frame (or from an inlined function)."""

from __future__ import annotations

from ..registry import handler
from ..variables import ConstantVariable


@handler("RETURN_VALUE")
def RETURN_VALUE(tx, inst):
    tx.do_return(tx.realize(tx.pop()))


@handler("RETURN_CONST", versions=(3, 12))
def RETURN_CONST(tx, inst):
    tx.do_return(ConstantVariable.create(inst.argval))
