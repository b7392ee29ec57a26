"""Returning from the frame (or from an inlined function)."""

from __future__ import annotations

from ..registry import handler
from ..variables import ConstantVariable


@handler("RETURN_VALUE")
def RETURN_VALUE(tx, inst):
    tx.do_return(tx.realize(tx.pop()))


@handler("RETURN_CONST", versions=((3, 12), (3, 13)))
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
    if getattr(tx, "suspend_on_yield", False):
        # paused; resume_generator pushes what ``yield`` evaluates to (a sent value, or
        # None), throw_into_generator raises at it (variables/generator_ctx.py)
        tx.paused_at_yield = True
        tx.done = True
    else:
        tx.push(ConstantVariable(None))  # what ``yield`` evaluates to: nothing is sent


@handler("GET_YIELD_FROM_ITER")
def GET_YIELD_FROM_ITER(tx, inst):
    """``yield from x``: ``iter(x)``, a generator as it is."""
    tx.push(tx.realize(tx.pop()).iter_var(tx))


def _send(tx):
    """SEND's step: the sent value to the delegate below it; (item, None) while it yields,
    (None, its return value) once it is exhausted."""
    from ...exc import Unsupported
    from ..variables.containers import IteratorVariable
    from ..variables.iterators import GeneratorMethodVariable, GeneratorVariable

    sent = tx.realize(tx.pop())
    receiver = tx.peek()
    none = isinstance(sent, ConstantVariable) and sent.value is None
    if isinstance(receiver, GeneratorVariable):
        if not none and not receiver.started:
            return GeneratorMethodVariable(receiver, "send").call_function(tx, [sent], {})
        item = receiver.resume(tx, sent if receiver.started else None)
        return (item, None) if item is not None else (None, receiver.return_value)
    if isinstance(receiver, IteratorVariable) and none:
        item = receiver.next_item(tx)
        return (item, None) if item is not None else (None, ConstantVariable(None))
    raise Unsupported(f"yield from {receiver.describe()} with a sent value")


@handler("SEND", versions=(3, 11))
def SEND_311(tx, inst):
    item, returned = _send(tx)
    if item is None:  # exhausted: the delegate is replaced by its return value
        tx.pop()
        tx.push(returned)
        tx.jump(inst)
    else:
        tx.push(item)


@handler("SEND", versions=((3, 12), (3, 13)))
def SEND_312(tx, inst):
    item, returned = _send(tx)
    tx.push(returned if item is None else item)
    if item is None:  # exhausted: END_SEND (the target) drops the delegate
        tx.jump(inst)


@handler("END_SEND", versions=((3, 12), (3, 13)))
def END_SEND(tx, inst):
    value = tx.pop()
    tx.pop()
    tx.push(value)


#: an inlined generator runs to its end at once; past this many values it is a graph break
MAX_YIELDS = 4096
