"""Stack shuffling and instructions with no symbolic effect."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler


@handler("NOP", "RESUME", "CACHE", "EXTENDED_ARG")
def NOP(tx, inst):
    pass


@handler("POP_TOP")
def POP_TOP(tx, inst):
    from ..variables.iterators import GeneratorVariable, close_dropped_generators

    value = tx.pop()
    if isinstance(value, GeneratorVariable):  # `break` out of `for v in gen(...)`
        close_dropped_generators(tx, [], only=value)


@handler("COPY")
def COPY(tx, inst):
    tx.push(tx.peek(inst.arg))


@handler("SWAP")
def SWAP(tx, inst):
    n = inst.arg
    tx.stack[-1], tx.stack[-n] = tx.stack[-n], tx.stack[-1]


@handler("BEFORE_WITH")
def BEFORE_WITH(tx, inst):
    """Enter a context manager: grad mode / autocast are recorded in the graph (see
    variables/ctx_managers.py); a Python ``__enter__``/``__exit__`` pair is inlined.  Pushes
    ``__exit__`` then what ``__enter__`` returned."""
    import types

    from ..variables.ctx_managers import (
        ContextExitVariable,
        ContextManagerVariable,
        wrap_context_object,
    )
    from ..variables.functions import method_of_pinned_class
    from ..variables.misc import python_dunder

    ctx = tx.realize(tx.pop())
    if not isinstance(ctx, ContextManagerVariable) and hasattr(ctx, "value"):
        wrapped = wrap_context_object(tx, ctx.value)
        if wrapped is not None:
            ctx = wrapped
    if isinstance(ctx, ContextManagerVariable):
        value = ctx.enter(tx)
        tx.push(ContextExitVariable(ctx))
        tx.push(value)
        return
    try:
        cls = ctx.python_type()
    except Unsupported:
        cls = None
    enter = python_dunder(cls, "__enter__") if isinstance(cls, type) else None
    exit_ = python_dunder(cls, "__exit__") if isinstance(cls, type) else None
    if enter is None or exit_ is None or not isinstance(exit_, types.FunctionType):
        raise Unsupported(f"`with` on {ctx.describe()}")
    # guarded through the class: replacing __enter__/__exit__ on it recompiles
    value = tx.call_function(method_of_pinned_class(tx, cls, "__enter__", enter, ctx), [], {})
    tx.push(method_of_pinned_class(tx, cls, "__exit__", exit_, ctx))
    tx.push(value)


@handler("BEFORE_ASYNC_WITH")
def BEFORE_ASYNC_WITH(tx, inst):
    raise Unsupported("`async with` is not captured")

# RAISE_VARARGS / RERAISE: handlers/exceptions.py
