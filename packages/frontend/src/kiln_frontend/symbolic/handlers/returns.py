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


@handler("RETURN_GENERATOR")
def RETURN_GENERATOR(tx, inst):
    if getattr(tx, "yielded", None) is None:
        from ...exc import Unsupported

        raise Unsupported("generator code outside an inlined generator")
    tx.push(ConstantVariable(None))  # the value "sent" first, popped by the next POP_TOP


@handler("YIELD_VALUE")
def YIELD_VALUE(tx, inst):
    if getattr(tx, "yielded", None) is None:
        from ...exc import Unsupported

        raise Unsupported("yield outside an inlined generator")
    if len(tx.yielded) >= MAX_YIELDS:
        from ...exc import Unsupported

        raise Unsupported(f"generator yielded more than {MAX_YIELDS} values (endless?)")
    tx.yielded.append(tx.pop())
    tx.push(ConstantVariable(None))  # what ``yield`` evaluates to: nothing is sent
    if getattr(tx, "suspend_on_yield", False):
        tx.done = True  # paused; resume_generator runs it on (variables/generator_ctx.py)


#: an inlined generator runs to its end at once; past this many values it is a graph break
MAX_YIELDS = 4096
