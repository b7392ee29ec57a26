"""The Python forms whose bytecode CPython 3.13 changed (issue 30), captured on every
version with the same graph count and the eager answer: superinstructions over two locals
(``LOAD_FAST_LOAD_FAST``, ``STORE_FAST_LOAD_FAST``, ``STORE_FAST_STORE_FAST``, also past
slot 15), keyword calls (``CALL_KW``), truth tests (``TO_BOOL``, ``COMPARE_OP``'s bool bit),
f-strings (``CONVERT_VALUE``/``FORMAT_SIMPLE``/``FORMAT_WITH_SPEC``), functions with
defaults, keyword defaults and closures (``SET_FUNCTION_ATTRIBUTE``), method calls and
``*args``/``**kwargs`` calls (the NULL above the callable), loops (``END_FOR; POP_TOP``),
and graph breaks in the middle of each, whose resume functions run these forms."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _break():
    print(end="")  # a graph break: print is not captured


def _opaque(t):
    _break()
    return t.shape[0]


def _kw(a, b=1, *, scale=1.0, shift=0.0):
    return (a + b) * scale + shift


class _Box:
    def __init__(self, t):
        self.t = t

    def grow(self, by, *, times=1):
        return self.t * times + by


def pairs(x, y):
    a, b = x, y  # STORE_FAST_STORE_FAST
    c = a + b  # LOAD_FAST_LOAD_FAST
    d = c
    return d * a - b  # STORE_FAST_LOAD_FAST (d = c; d ...)


def _total(*ts):
    return sum(ts)


def pairs_past_slot_15(x):
    # the break leaves 19 values on the stack: in the resume function they are its first
    # arguments, and s, a, b (slots 1-3 here) move past slot 15
    s = _total(x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7, x + 8, x + 9, x + 10,
               x + 11, x + 12, x + 13, x + 14, x + 15, _opaque(x))
    a, b = s, x  # STORE_FAST_STORE_FAST
    return a * b + a  # LOAD_FAST_LOAD_FAST


def keyword_calls(x):
    y = _kw(x, 2, scale=3.0)
    z = torch.sum(y, dim=0, keepdim=True)
    return _kw(z, shift=1.0)


def keyword_call_broken_in_the_middle(x):
    y = x * 2
    z = _kw(y, _opaque(y), scale=2.0)  # breaks with _kw and its NULL on the stack
    return z + 1


def truth_tests(x, n, flag):
    out = x
    if n:
        out = out + 1
    if not flag:
        out = out * 2
    if n > 2 and flag is None:
        out = out - 3
    if x.shape[0] > 2:
        out = out.relu()
    return out, not n, n < 5


def tensor_truth_breaks(x):
    y = x + 1
    if y.sum() > 0:  # data-dependent: a graph break at the jump
        return y * 2
    return y - 2


def fstrings(x, name):
    label = f"{name!r}:{x.shape[0]:>4}|{3.14159:.2f}|{name}"
    return x * len(label), label


def nested_functions(x, k):
    def scale(t, by=2.0, *, bias=k):
        return t * by + bias + k

    add = lambda t, u=1: t + u + k  # noqa: E731
    return scale(x), scale(x, 3.0, bias=0.5), add(x)


def method_and_star_calls(x, args, kwargs):
    box = _Box(x)
    a = box.grow(1.0, times=2)
    b = _kw(*args, **kwargs)
    c = torch.stack([*args])
    return a + b + c.sum(0)


def loops(x, n):
    total = x
    for i in range(n):
        total = total + i
    for t in [x, x * 2]:
        total = total * t
    return total


def break_between_callable_and_call(x):
    y = torch.cos(x)
    return torch.add(y, _opaque(y))  # a break with torch.add and its NULL pending


CASES = [
    (pairs, lambda: (torch.randn(3), torch.randn(3)), 1),
    (pairs_past_slot_15, lambda: (torch.randn(3),), 2),
    (keyword_calls, lambda: (torch.randn(2, 3),), 1),
    (keyword_call_broken_in_the_middle, lambda: (torch.randn(3),), 2),
    (truth_tests, lambda: (torch.randn(4), 3, None), 1),
    (tensor_truth_breaks, lambda: (torch.ones(3),), 2),
    (fstrings, lambda: (torch.randn(3), "kiln"), 1),
    (nested_functions, lambda: (torch.randn(3), 0.25), 1),
    (method_and_star_calls, lambda: (torch.randn(3), (torch.randn(3), torch.randn(3)),
                                     {"scale": 2.0}), 1),
    (loops, lambda: (torch.randn(3), 3), 1),
    (break_between_callable_and_call, lambda: (torch.randn(3),), 2),
]


def _same(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _same(a, e)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    else:
        assert actual == expected


@pytest.mark.parametrize("fn,make_args,graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_same_graphs_and_answer_on_every_python(fn, make_args, graphs):
    backend = CountingBackend()
    args = make_args()
    expected = fn(*args)
    compiled = kiln_compile(fn, backend=backend)
    _same(compiled(*args), expected)
    assert len(backend.graphs) == graphs, [gm.code for gm in backend.graphs]
    _same(compiled(*args), expected)  # the cached entry
    assert len(backend.graphs) == graphs


def test_a_compiled_frame_calls_its_graph_without_swaps():
    """The hot path: a compiled frame loads its graph's global and calls it natively."""
    from kiln_frontend import convert
    from kiln_frontend.bytecode import decode

    made = []
    real = convert._convert_frame

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    def f(x, y):
        return (x + y).relu()

    convert._convert_frame = spy
    try:
        x, y = torch.randn(3), torch.randn(3)
        torch.testing.assert_close(kiln_compile(f, backend="eager")(x, y), (x + y).relu())
    finally:
        convert._convert_frame = real
    (frame,) = [m for m in made if m is not None]
    ops = [i.opname for i in decode(frame.fn.__code__)]
    assert "SWAP" not in ops and "PUSH_NULL" not in ops, ops
