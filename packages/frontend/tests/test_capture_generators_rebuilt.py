"""Generators paused at a graph break and rebuilt for the resume function
(``GeneratorVariable._reconstruct_paused``): paused inside ``yield from`` (``throw``/
``close`` reach the delegate); pinned clean breaks (the frame runs as is) for one paused
inside ``try``/``finally`` and for one whose code has cell variables. Each is compared with eager
(results and the order of what the bodies log) and its graphs counted."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from _reference_cases import same
from kiln_frontend import compile as kiln_compile

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _check(fn, *args, graphs):
    expected = fn(*args)
    backend = CountingBackend()
    actual = kiln_compile(fn, backend=backend)(*args)
    same(actual, expected)
    assert len(backend.graphs) == graphs, backend


def _plain(x):
    yield x + 1
    yield x + 2
    return "inner done"


def _delegating(x, log, inner=None):
    got = yield from (inner if inner is not None else _plain(x))
    log.append(("inner returned", got))
    yield x + 3


def test_paused_in_yield_from_consumed_after_break():
    def f(x):
        log = []
        g = _delegating(x, log)
        a = next(g)
        print("break")
        return a, list(g), log

    _check(f, torch.randn(4), graphs=1)


def test_paused_in_yield_from_closed_after_break_reaches_delegate():
    import inspect

    def f(x):
        log = []
        inner = _plain(x)
        g = _delegating(x, log, inner)
        a = next(g)
        print("break")
        g.close()
        return a * 2, inspect.getgeneratorstate(inner), log

    _check(f, torch.randn(4), graphs=2)


class _Stop(Exception):
    pass


def test_paused_in_yield_from_thrown_into_after_break():
    import inspect

    def f(x):
        inner = _plain(x)
        g = _delegating(x, [], inner)
        a = next(g)
        print("break")
        try:
            g.throw(_Stop("in"))
        except _Stop as e:
            return a, str(e), inspect.getgeneratorstate(inner)
        return a, "", ""

    _check(f, torch.randn(4), graphs=1)


def _guarded_inner(x, log):
    try:
        yield x + 1
        yield x + 2
    finally:
        log.append("inner finally")


def test_paused_in_yield_from_with_finally_breaks_cleanly():
    # pinned: a graph break while a generator (here the delegate) is paused inside
    # try/finally runs the frame as is (the resume function's transformed code would keep a
    # rebuilt one alive past a `del`, running its finally late)
    def f(x):
        log = []
        g = _delegating(x, log, _guarded_inner(x, log))
        a = next(g)
        print("break")
        del g
        log.append("after del")
        return a, log

    _check(f, torch.randn(4), graphs=0)


def _cell_shared_with_returned_function(x):
    total = 0

    def bump(n):
        nonlocal total
        total += n
        return total

    yield bump
    yield x * total
    yield x + total


def test_paused_generator_with_cell_variables_breaks_cleanly():
    # pinned: a paused generator whose code has cell variables is not rebuilt; the frame
    # runs as is, as under torch.compile (which compiles only the frames it calls; a graph
    # of this frame would be one torch.compile does not make)
    def f(x):
        y = x * 2
        g = _cell_shared_with_returned_function(x)
        bump = next(g)
        bump(2)
        print("break")
        bump(3)  # the generator reads 5
        return y, list(g)

    _check(f, torch.randn(4), graphs=0)


def _guarded(x, log):
    try:
        yield x + 1
        yield x + 2
    finally:
        log.append("finally")


def test_paused_in_finally_dropped_after_break_breaks_cleanly():
    # pinned (see above): the frame runs as is, the finally runs at the `del`
    def f(x):
        log = []
        g = _guarded(x, log)
        a = next(g)
        print("break")
        del g
        log.append("after del")
        return a, log

    _check(f, torch.randn(4), graphs=0)
