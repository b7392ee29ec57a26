"""A cache entry whose transformed code only returns its one graph's output runs without
that code's frame: the C hook calls the graph itself (_evalframe.c, note 9).

A frame captured as one graph becomes ``return __compiled_fn_N(a, c)[0]`` (in bytecode: load
the global, load argument slots, call, unpack one, return it).  Evaluating that frame is
most of what a compiled call costs over eager after its guards, so the entry carries a
``DirectCall`` (the graph and the slots it takes) that the hook runs instead.  Found by
reading the transformed code with a small stack machine over the few instructions that
shape uses, so it does not depend on how the code generator spells it.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from . import _evalframe
from .bytecode import builders, decode, versions

_GLOBAL = object()  # the stack's callable (the global) and its NULL
_NULL = object()
_RESULT = object()  # the call's result, then its one item
_ITEM = object()

#: instructions with no effect on the shape's stack
_NO_EFFECT = frozenset({"RESUME", "NOP", "PRECALL", "COPY_FREE_VARS"})


class _Slot:
    """An argument slot's value on the stack."""

    def __init__(self, index: int):
        self.index = index


def direct_call(fn: Any) -> Any:
    """The ``_evalframe.DirectCall`` of ``fn`` when its code is exactly a call of one global
    with argument slots whose one-item result it returns, else None."""
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    if code.co_cellvars or code.co_exceptiontable:
        return None
    nslots = (code.co_argcount + code.co_kwonlyargcount
              + bool(code.co_flags & inspect.CO_VARARGS)
              + bool(code.co_flags & inspect.CO_VARKEYWORDS))
    argnames = code.co_varnames[:nslots]
    try:
        insts = [part for inst in decode(code) for part in builders.split_paired(inst)]
    except ValueError:
        return None
    stack: list[Any] = []
    stored: dict[str, Any] = {}
    callee = slots = lineno = None
    for inst in insts:
        op = inst.opname
        if op in _NO_EFFECT:
            continue
        if op == "PUSH_NULL":
            stack.append(_NULL)
        elif op == "LOAD_GLOBAL" and callee is None:
            if inst.arg & 1:
                stack.extend((_GLOBAL, _NULL) if versions.NULL_ABOVE_CALLABLE else (_NULL, _GLOBAL))
            else:
                stack.append(_GLOBAL)
            callee = inst.argval
        elif op in ("LOAD_FAST", "LOAD_FAST_CHECK"):
            if inst.argval in stored:
                stack.append(stored[inst.argval])
            elif inst.argval in argnames:
                stack.append(_Slot(argnames.index(inst.argval)))
            else:
                return None
        elif op == "SWAP" and len(stack) >= inst.arg:
            stack[-1], stack[-inst.arg] = stack[-inst.arg], stack[-1]
        elif op == "CALL" and slots is None:
            args = stack[len(stack) - inst.arg:] if inst.arg else []
            del stack[len(stack) - inst.arg:]
            if (not all(isinstance(a, _Slot) for a in args) or len(stack) != 2
                    or {id(x) for x in stack} != {id(_GLOBAL), id(_NULL)}):
                return None
            stack = [_RESULT]
            slots = tuple(a.index for a in args)
            lineno = inst.lineno
        elif op == "UNPACK_SEQUENCE" and inst.arg == 1 and stack == [_RESULT]:
            stack = [_ITEM]
        elif op == "STORE_FAST" and stack == [_ITEM] and inst.argval not in argnames:
            stored[inst.argval] = stack.pop()
        elif op == "RETURN_VALUE" and stack == [_ITEM]:
            break
        else:
            return None
    else:
        return None
    graph = fn.__globals__.get(callee)
    if graph is None or not callable(graph) or lineno is None:
        return None
    try:
        return _evalframe.DirectCall(graph, slots, lineno)
    except ValueError:  # more slots out of order than the hook gathers
        return None


__all__ = ["direct_call"]
