"""Stand-ins for what a compiler hands the eval-frame hook, for the hook's own tests (not a
test module): a guard on argument types and a plain copy of the frame's code."""

from __future__ import annotations

import types


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
