"""Stand-ins for what a compiler hands the eval-frame hook, for the hook's own tests (not a
test module): a guard on argument types, ``hooked`` to run one call under a callback, and
functions with cells and recursion that the hook's tests call (module level: their code
objects are stable)."""

from __future__ import annotations

import types

from kiln_frontend import _evalframe as C


def type_guard(args) -> types.FunctionType:
    """``check(*args)``: the call's argument types are those of ``args``. It has the
    ``failure_reason(*args)`` and ``expected`` (the types) the hook and its logs read."""
    expected = tuple(type(a) for a in args)

    def check(*args):
        return tuple(type(a) for a in args) == expected

    def failure_reason(*args):
        for i, (want, a) in enumerate(zip(expected, args, strict=False)):
            if type(a) is not want:
                return f"type of arg {i}: expected {want.__name__}, actual {type(a).__name__}"
        return None

    check.failure_reason = failure_reason
    check.expected = expected
    return check


def hooked(callback, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``callback`` as this thread's eval-frame callback (the
    previous one restored after)."""
    prev = C.set_eval_frame(callback)
    try:
        return fn(*args, **kwargs)
    finally:
        C.set_eval_frame(prev)


def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


def make_closure(k):
    def closed(x):
        return x + k

    return closed


def cell_arg(x):
    def get():
        return x

    return get() + 1
