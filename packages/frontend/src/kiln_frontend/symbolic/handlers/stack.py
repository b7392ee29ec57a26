"""Stack shuffling and instructions with no symbolic effect."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler


@handler("NOP", "RESUME", "CACHE", "EXTENDED_ARG")
def NOP(tx, inst):
    pass


@handler("POP_TOP")
def POP_TOP(tx, inst):
    tx.pop()


@handler("COPY")
def COPY(tx, inst):
    tx.push(tx.peek(inst.arg))


@handler("SWAP")
def SWAP(tx, inst):
    n = inst.arg
    tx.stack[-1], tx.stack[-n] = tx.stack[-n], tx.stack[-1]


@handler("BEFORE_WITH", "SETUP_WITH", "BEFORE_ASYNC_WITH")
def BEFORE_WITH(tx, inst):
    raise Unsupported("`with` blocks are not captured yet")


@handler("RAISE_VARARGS", "RERAISE")
def RAISE_VARARGS(tx, inst):
    raise Unsupported("raising an exception in captured code")
