"""Corpus: inlining user functions, closures and nonlocals, nested functions and lambdas,
methods, ``super()``, ``functools.partial``, argument binding, recursion."""

from __future__ import annotations

import functools

import pytest
import torch
from _harness import Case as _Case
from _harness import case_params, check_case

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape):
    return torch.randn(*shape)


# -- plain functions ---------------------------------------------------------------------


def _helper(x, y):
    return x * 2 + y


def inline_simple(x, y):
    return _helper(x, y).sin()


def _deep3(x):
    return x.cos() + 1


def _deep2(x):
    return _deep3(x) * 2


def _deep1(x):
    return _deep2(x) - x


def inline_nested_calls(x):
    return _deep1(x)


def _defaults(x, a=2, *, b=3.0, c=None):
    y = x * a + b
    if c is not None:
        y = y + c
    return y


def inline_defaults_and_kwonly(x, y):
    return _defaults(x) + _defaults(x, 3, b=1.0) + _defaults(x, c=y)


def _star(*args, **kwargs):
    out = args[0]
    for a in args[1:]:
        out = out + a
    for k in sorted(kwargs):
        out = out * kwargs[k]
    return out


def inline_star_args(x, y):
    return _star(x, y, x, scale=2.0, bias=y)


def inline_call_ex(x, y):
    args = (x, y)
    kw = {"scale": 3.0}
    return _star(*args, **kw) + _star(*[x, x])


def _posonly(a, b, /, c, *, d):
    return a - b + c * d


def inline_posonly(x, y):
    return _posonly(x, y, c=x, d=2)


def inline_keyword_to_positional(x, y):
    return _helper(y=y, x=x)


def _returns_tuple(x):
    return x + 1, x - 1, {"k": x * 2}


def inline_returns_containers(x):
    a, b, d = _returns_tuple(x)
    return a * b + d["k"]


def _recursive(x, n):
    if n == 0:
        return x
    return _recursive(x * 2, n - 1) + 1


def inline_recursion(x):
    return _recursive(x, 4)


# -- closures, nonlocals, nested functions and lambdas --------------------------------------


def _make_scaler(s):
    def scale(x):
        return x * s

    return scale


_scale3 = _make_scaler(3.0)


def inline_global_closure(x):
    return _scale3(x) + 1


def inner_function_reads_local(x, y):
    k = 2.0

    def inner(z):
        return z * k + y

    return inner(x) + inner(y)


def inner_function_nonlocal(x):
    total = x

    def add(v):
        nonlocal total
        total = total + v

    add(x)
    add(x * 2)
    return total


def lambda_in_frame(x, y):
    f = lambda a, b=2: a * b + y  # noqa: E731
    return f(x) + f(x, 3)


def nested_closure_chain(x):
    a = 1.0

    def outer(u):
        b = 2.0

        def inner(v):
            return v * a + b + u

        return inner(u * 3)

    return outer(x)


def closure_returned_and_called(x):
    def make(k):
        return lambda t: t + k

    add2 = make(2)
    add5 = make(5)
    return add2(x) * add5(x)


def closure_over_tensor_in_frame(x, y):
    def use():
        return x @ y

    return use().relu()


def cell_argument_mutated(x):
    def bump():
        nonlocal x
        x = x + 1

    bump()
    bump()
    return x


def nested_defaults(x):
    def f(a, b=x * 2):
        return a + b

    return f(x)


def closure_function_returned(x):
    def g(t):
        return t.sin() * x

    return g(x), g


def closure_across_graph_break(x):
    scale = 2.0

    def f(t):
        return t * scale

    y = f(x)
    print("graph break")
    scale = 3.0
    return f(y) + 1


def nonlocal_across_graph_break(x):
    total = x

    def add(v):
        nonlocal total
        total = total + v

    add(x)
    print("graph break")
    add(x * 2)
    return total


def comprehension_cell_across_graph_break(x):
    # on 3.11 the comprehension closes over ``x``: ``x`` is a cell variable of this frame
    ys = [x * i for i in range(3)]
    print("graph break")
    return x + ys[1]


# -- methods, classmethods, staticmethods, super() -----------------------------------------


class Scaler:
    factor = 3.0

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias

    @staticmethod
    def twice(x):
        return x * 2

    @classmethod
    def make_factor(cls, x):
        return x * cls.factor

    @property
    def neg_bias(self):
        return -self.bias


class ChildScaler(Scaler):
    factor = 5.0

    def apply(self, x):
        return super().apply(x) + 1

    def other(self, x):
        return super().apply(x) - Scaler.apply(self, x)


def method_call(x, s):
    return s.apply(x) + Scaler.twice(x) + s.twice(x)


def classmethod_call(x, s):
    return Scaler.make_factor(x) + s.make_factor(x)


def property_access(x, s):
    return x + s.neg_bias


def super_call(x, s):
    return s.apply(x)


def super_two_args(x, s):
    return s.other(x)


# -- functools.partial ----------------------------------------------------------------------

_partial_global = functools.partial(_defaults, a=4)


def partial_global(x):
    return _partial_global(x, b=0.5)


def partial_in_frame(x, y):
    p = functools.partial(_helper, y=y)
    return p(x) + functools.partial(torch.add, alpha=2)(x, y)


def partial_of_partial(x):
    p = functools.partial(functools.partial(_star, x), x)
    return p(x, w=3.0)


CASES = [
    Case(inline_simple, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_nested_calls, (_t(3, 3),), 1, fullgraph=True),
    Case(inline_defaults_and_kwonly, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_star_args, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_call_ex, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_posonly, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_keyword_to_positional, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inline_returns_containers, (_t(4),), 1, fullgraph=True),
    Case(inline_recursion, (_t(4),), 1, fullgraph=True),
    Case(inline_global_closure, (_t(4),), 1, fullgraph=True),
    Case(inner_function_reads_local, (_t(4), _t(4)), 1, fullgraph=True),
    Case(inner_function_nonlocal, (_t(4),), 1, fullgraph=True),
    Case(lambda_in_frame, (_t(4), _t(4)), 1, fullgraph=True),
    Case(nested_closure_chain, (_t(4),), 1, fullgraph=True),
    Case(closure_returned_and_called, (_t(4),), 1, fullgraph=True),
    Case(closure_over_tensor_in_frame, (_t(3, 4), _t(4, 2)), 1, fullgraph=True),
    Case(cell_argument_mutated, (_t(4),), 1, fullgraph=True),
    Case(nested_defaults, (_t(4),), 1, fullgraph=True),
    Case(closure_across_graph_break, (_t(4),), 2),
    Case(nonlocal_across_graph_break, (_t(4),), 2),  # as torch.compile: the resume writes the cell
    Case(comprehension_cell_across_graph_break, (_t(4),), 2),
    Case(method_call, (_t(4), Scaler(0.5)), 1, fullgraph=True),
    Case(classmethod_call, (_t(4), Scaler(0.5)), 1, fullgraph=True),
    Case(property_access, (_t(4), Scaler(0.5)), 1, fullgraph=True),
    Case(super_call, (_t(4), ChildScaler(0.25)), 1, fullgraph=True),
    Case(super_two_args, (_t(4), ChildScaler(0.25)), 1, fullgraph=True),
    Case(partial_global, (_t(4),), 1, fullgraph=True),
    Case(partial_in_frame, (_t(4), _t(4)), 1, fullgraph=True),
    Case(partial_of_partial, (_t(4),), 1, fullgraph=True),
]


@case_params(CASES)
def test_inline_case(case):
    case.check()


def test_returned_closure_is_callable():
    x = _t(4)
    res = check_case(closure_function_returned, (x,), 1, mutate_check=lambda a: a[0],
                     fullgraph=False)
    out, g = res.result
    torch.testing.assert_close(g(x), x.sin() * x)


def test_recursion_beyond_inline_limit_breaks(monkeypatch):
    from kiln_frontend import config

    monkeypatch.setattr(config, "inline_depth_limit", 2, raising=False)
    # the call that would exceed the limit runs in Python; its frame is captured on its own
    res = check_case(inline_recursion, (_t(4),), None)
    assert len(res.graphs) >= 2


def test_recursion_beyond_limit_fullgraph_raises(monkeypatch):
    import kiln_frontend
    from kiln_frontend import config

    monkeypatch.setattr(config, "inline_depth_limit", 2, raising=False)
    with pytest.raises(kiln_frontend.Unsupported, match="inlin"):
        check_case(inline_recursion, (_t(4),), 1, fullgraph=True)
