"""Guards that pass again: a value that is a new object at every access (a bound builtin
method such as ``ctxvar.reset``, a method-wrapper, a bound Python method) is guarded by
what it is (type, ``__self__``, function or name), not by its identity, which would fail on
every call and recompile until ``cache_size_limit`` (the storm seen on transformers BERT).

Each case calls the compiled function several times and asserts that it compiled once and
never recompiled; then rebinds the method to another object and checks that the guard can
still fail (a recompile, and the right result).  ``convert`` itself checks that a fresh
entry's guards pass on the inputs it was traced with (``test_guard_that_cannot_pass``).
"""

from __future__ import annotations

import contextvars
import types

import kiln_frontend
import kiln_frontend.guards as guards_mod
import pytest
import torch
from kiln_frontend.eval_frame import counters
from torch.testing import assert_close


def _graph_backend(gm, example_inputs):
    return gm.forward


class _Holder:
    def __init__(self, scale: float = 2.0):
        self.context_var = contextvars.ContextVar("v", default=0)
        self.table = {"a": scale}
        self.n = 3
        self.other = _Scaler(scale)
        self.bound = self.other.apply  # a bound Python method stored as an attribute


class _Scaler:
    def __init__(self, k: float):
        self.k = k

    def apply(self, x):
        return x * self.k


def _ctxvar_set_reset(h, x):  # the pattern of transformers' output_capturing.py
    token = h.context_var.set(1)
    y = x.sin()
    h.context_var.reset(token)
    return y


def _builtin_method(h, x):  # dict.get bound to an attribute's dict
    return x * h.table.get("a")


def _method_wrapper(h, x):  # int.__add__ bound: a method-wrapper
    return x * h.n.__add__(1)


def _stored_bound_method(h, x):
    return h.bound(x) + 1


CASES = {
    "ctxvar set/reset": _ctxvar_set_reset,
    "builtin method": _builtin_method,
    "method-wrapper": _method_wrapper,
    "stored bound method": _stored_bound_method,
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_compile_on_repeated_calls(name):
    fn = CASES[name]
    kiln_frontend.reset()
    h = _Holder()
    compiled = kiln_frontend.compile(fn, backend=_graph_backend)
    x = torch.randn(4)
    assert_close(compiled(h, x), fn(h, x))
    compiles = counters["compiles"]
    assert compiles >= 1, "nothing was compiled"
    for _ in range(4):
        assert_close(compiled(h, x), fn(h, x))
    assert counters["compiles"] == compiles, kiln_frontend.explain(fn, h, x)
    assert counters["recompiles"] == 0
    assert counters["internal_errors"] == 0

    # the guards can still fail: the same attribute on another object recompiles
    h2 = _Holder(scale=5.0)
    h2.n = 7
    assert_close(compiled(h2, x), fn(h2, x))
    kiln_frontend.reset()


def test_rebound_method_recompiles():
    """``h.bound`` rebound to another object's method: ``__self__`` differs."""
    kiln_frontend.reset()
    h = _Holder()
    compiled = kiln_frontend.compile(_stored_bound_method, backend=_graph_backend)
    x = torch.randn(4)
    assert_close(compiled(h, x), _stored_bound_method(h, x))
    h.bound = _Scaler(11.0).apply
    assert_close(compiled(h, x), _stored_bound_method(h, x))
    assert counters["recompiles"] == 1
    kiln_frontend.reset()


@pytest.mark.parametrize("value,fresh", [
    (contextvars.ContextVar("c").set, True),
    ({}.get, True),
    ((1).__add__, True),
    (_Scaler(1.0).apply, True),
    (len, False),  # a builtin function: __self__ is the builtins module
    (torch.sin, False),
    (_Scaler.apply, False),
    (dict.get, False),  # a method descriptor: stored on the class
])
def test_is_fresh_per_access(value, fresh):
    assert guards_mod.is_fresh_per_access(value) is fresh


def test_identity_guards_of_bound_method():
    from kiln_frontend.sources import AttrSource, LocalSource

    h = _Holder()
    src = AttrSource(AttrSource(LocalSource("h"), "context_var"), "reset")
    kinds = [(g.source.name(), g.kind) for g in
             guards_mod.identity_guards(src, h.context_var.reset)]
    assert kinds == [
        ("L['h'].context_var.reset", guards_mod.GuardKind.TYPE_MATCH),
        ("L['h'].context_var.reset.__self__", guards_mod.GuardKind.ID_MATCH),
        ("L['h'].context_var.reset.__name__", guards_mod.GuardKind.CONSTANT_MATCH),
    ]
    check = guards_mod.build_check_fn(guards_mod.identity_guards(src, h.context_var.reset),
                                      ["h"], {})
    assert check(h) and check(h)  # passes again: not an identity guard on a new object
    assert not check(_Holder())  # another ContextVar
    assert isinstance(h.context_var.reset, types.BuiltinMethodType)


def test_guard_that_cannot_pass(monkeypatch, capfd):
    """Without the fix (identity guards on bound methods), ``convert`` finds the guard that
    fails on the very inputs it was compiled for: an internal error, the frame runs eagerly
    (correctly), and the message names the guard."""
    monkeypatch.setattr(guards_mod, "is_fresh_per_access", lambda value: False)
    kiln_frontend.reset()
    h = _Holder()
    compiled = kiln_frontend.compile(_ctxvar_set_reset, backend=_graph_backend)
    x = torch.randn(4)
    for _ in range(3):
        assert_close(compiled(h, x), _ctxvar_set_reset(h, x))
    assert counters["internal_errors"] == 1
    assert "L['h'].context_var.set is not the builtin seen at compile time" in \
        capfd.readouterr().err
    assert counters["recompiles"] == 0
    kiln_frontend.reset()
