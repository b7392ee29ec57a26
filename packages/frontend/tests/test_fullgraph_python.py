"""``fullgraph=True`` on ordinary Python that TorchDynamo captures in one graph (issue 10):
each function compiles to exactly one graph and agrees with eager."""

from __future__ import annotations

import collections
import functools
import math

import pytest
import torch
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset
from kiln_frontend.symbolic.variables import stdlib
from torch import nn


@pytest.fixture(autouse=True)
def _fresh():
    reset()
    yield
    reset()


def one_graph(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    expected = fn(*args)
    actual = kiln_compile(fn, backend=backend, fullgraph=True)(*args)
    torch.testing.assert_close(actual, expected)
    assert len(graphs) == 1, [gm.code for gm in graphs]
    return graphs[0]


class Scaler:
    @staticmethod
    def shift(x):
        return x + 1

    @classmethod
    def double(cls, x):
        return x * 2


def test_staticmethod_and_classmethod():
    one_graph(lambda x: Scaler.shift(x) + Scaler.double(x) + Scaler().shift(x), torch.randn(3))


def test_functools_reduce():
    one_graph(lambda x: functools.reduce(lambda a, b: a * b, [x, x + 1, x + 2]), torch.randn(3))
    one_graph(lambda x: functools.reduce(torch.add, [x, x], x), torch.randn(3))


def test_math_on_python_numbers():
    def f(x):
        return x * math.cos(0.5) + math.log2(8.0) + math.hypot(3.0, 4.0) + math.factorial(4)

    one_graph(f, torch.randn(3))


def test_hasattr():
    one_graph(lambda x: x + 1 if hasattr(x, "shape") and not hasattr(x, "nope") else x,
              torch.randn(3))


def test_ordered_dict_defaultdict_fromkeys_built_in_the_frame():
    def f(x):
        d = collections.OrderedDict()
        d["a"] = x
        dd = collections.defaultdict(list)
        dd["k"].append(x * 2)
        dd["k"].append(x * 3)
        keys = dict.fromkeys(["p", "q"], 2)
        return d["a"] + sum(dd["k"]) * keys["q"]

    one_graph(f, torch.randn(3))


def test_returned_ordered_dict_and_defaultdict_are_rebuilt():
    def f(x):
        d = collections.OrderedDict(a=x + 1)
        dd = collections.defaultdict(int)
        dd["n"] += 1
        return d, dd

    d, dd = kiln_compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    assert type(d) is collections.OrderedDict and type(dd) is collections.defaultdict
    assert dd.default_factory is int and dd["n"] == 1
    torch.testing.assert_close(d["a"], torch.full((2,), 2.0))


def test_module_built_in_the_frame():
    one_graph(lambda x: nn.Softmax(dim=-1)(x) + nn.GELU(approximate="tanh")(x),
              torch.randn(2, 5))


def test_module_with_parameters_built_in_the_frame_breaks():
    def f(x):
        return nn.Linear(3, 3)(x)

    with pytest.raises(Exception, match="holds tensors"):
        kiln_compile(f, backend="eager", fullgraph=True)(torch.randn(2, 3))


def test_foreach_ops():
    one_graph(lambda x, y: torch._foreach_mul(torch._foreach_add([x, y], 1.0), 2.0),
              torch.randn(3), torch.randn(4))


def test_library_predicates_fold():
    def f(x):
        if torch.distributed.is_available() and not torch.fx._symbolic_trace.is_fx_tracing():
            return x + 1
        return x - 1

    gm = one_graph(f, torch.randn(3))
    assert "is_available" not in gm.code


def test_stdlib_tables_refuse_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        stdlib.register_builtin(functools.reduce, lambda tx, a, k: None)
    with pytest.raises(ValueError, match="already registered"):
        stdlib.register_constructor(collections.OrderedDict, lambda tx, c, a, k: None)


def test_partial_kept_across_a_graph_break():
    from kiln_frontend import explain

    def g(x):
        p = functools.partial(torch.add, alpha=2)
        y = p(x, 1)
        print(end="")  # graph break
        return p(y, 1)

    x = torch.randn(3)
    out = explain(g)(x)
    assert out.graph_count == 2, out
    torch.testing.assert_close(kiln_compile(g, backend="eager")(x), g(x))


def test_compiled_module_pickles_and_saves():
    import io
    import pickle

    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    cm = kiln_compile(m, backend="eager", fullgraph=True)
    x = torch.randn(2, 3)
    torch.testing.assert_close(cm(x), m(x))
    copy = pickle.loads(pickle.dumps(cm))
    assert type(copy) is type(cm)
    torch.testing.assert_close(copy(x), m(x))
    buf = io.BytesIO()
    torch.save(cm, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), m(x))


def test_module_compiled_with_a_local_backend_does_not_pickle():
    import pickle

    cm = kiln_compile(nn.ReLU(), backend=lambda gm, ex: gm.forward)
    with pytest.raises((AttributeError, pickle.PicklingError, TypeError)):
        pickle.dumps(cm)
