"""The virtualized ``ops`` handler that loop bodies call.

A loop body is a plain Python function; what ``ops.sin(x)`` means depends on the handler
installed with ``set_ops_handler``: the printer turns it into text, the interpreter into torch
ops, a codegen into C++ or Triton source, an analysis into a list of memory dependencies.

    from kiln_loopir.virtualized import ops, set_ops_handler

    with set_ops_handler(MyHandler()):
        body(index)

A handler is any object with one method per op name of :mod:`kiln_loopir.ops_spec`. Calling an
op the installed handler lacks raises ``MissingOpError`` naming the op and the handler.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

__all__ = ["ops", "set_ops_handler", "get_ops_handler", "MissingOpError", "NoHandlerError"]


class MissingOpError(NotImplementedError):
    """The installed ops handler does not implement an op of the spec."""

    def __init__(self, op: str, handler=None):
        self.op = op
        self.handler = handler
        who = type(handler).__name__ if handler is not None else "the ops handler"
        super().__init__(f"{who} does not implement op {op!r} (see kiln_loopir/ops_spec.py)")


class NoHandlerError(RuntimeError):
    pass


_state = threading.local()


def get_ops_handler():
    h = getattr(_state, "handler", None)
    if h is None:
        raise NoHandlerError("no ops handler is installed (use kiln_loopir.virtualized.set_ops_handler)")
    return h


@contextmanager
def set_ops_handler(handler):
    prev = getattr(_state, "handler", None)
    _state.handler = handler
    try:
        yield handler
    finally:
        _state.handler = prev


class _OpsProxy:
    """``ops.<name>(...)`` forwards to the installed handler's method ``<name>`` (looked up at
    call time, so ``f = ops.sin`` may be taken before any handler is installed)."""

    _dispatchers: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        fn = _OpsProxy._dispatchers.get(name)
        if fn is None:
            def fn(*args, **kwargs):
                handler = get_ops_handler()
                try:
                    method = getattr(handler, name)
                except AttributeError:
                    raise MissingOpError(name, handler) from None
                return method(*args, **kwargs)

            fn.__name__ = name
            fn.__qualname__ = f"ops.{name}"
            _OpsProxy._dispatchers[name] = fn
        return fn

    def __repr__(self) -> str:
        return "<kiln_loopir ops proxy>"


ops = _OpsProxy()
