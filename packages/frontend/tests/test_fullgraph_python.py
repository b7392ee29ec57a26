"""``fullgraph=True`` on ordinary Python that TorchDynamo captures in one graph (issue 10):
each function compiles to exactly one graph and agrees with eager."""

from __future__ import annotations

import collections
import contextlib
import functools
import math

import pytest
import torch
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset
from kiln_frontend.symbolic.variables import stdlib
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


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


# -- try / except ----------------------------------------------------------------------------

def _helper_that_raises(x):
    if x.dim() == 2:
        raise ValueError("two dims", 2)
    return x


def test_raise_and_catch_in_one_graph():
    def f(x):
        try:
            raise ValueError("no")
        except (TypeError, ValueError) as e:
            x = x + len(e.args)
        try:
            y = _helper_that_raises(x)  # raised in an inlined call, caught here
        except ValueError as e:
            y = x * e.args[1]
        finally:
            y = y - 1
        return y

    one_graph(f, torch.randn(2, 3))


def test_key_error_caught():
    def f(x, d):
        try:
            scale = d["missing"]
        except KeyError:
            scale = d["present"]
        return x * scale

    one_graph(f, torch.randn(3), {"present": 3})


def test_uncaught_raise_is_a_break_and_raises_like_eager():
    def f(x):
        y = x + 1
        try:
            raise KeyError("k")
        except ValueError:
            y = y * 2
        return y

    with pytest.raises(Exception, match="KeyError raised in captured code"):
        kiln_compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    reset()
    with pytest.raises(KeyError):
        kiln_compile(f, backend="eager")(torch.randn(3))


def test_raise_inside_with_runs_exit():
    class Flag:
        def __init__(self):
            self.exited = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.exited += 1
            return True  # swallow

    def f(x, flag):
        with flag:
            x = x + 1
            raise ValueError
        return x * 2

    eager_flag, flag = Flag(), Flag()
    expected = f(torch.ones(2), eager_flag)
    out = kiln_compile(f, backend="eager")(torch.ones(2), flag)
    torch.testing.assert_close(out, expected)
    assert flag.exited == eager_flag.exited == 1


# -- @contextlib.contextmanager -------------------------------------------------------------

@contextlib.contextmanager
def _scoped(log, scale):
    log.append("enter")
    try:
        yield scale * 2
    finally:
        log.append("exit")


def test_contextmanager_generator_one_graph_in_order():
    """The code after ``yield`` runs when the block is left, not at entry: the body sees
    one entry in the log, the code after the block two."""

    def f(x, log):
        with _scoped(log, 3) as k:
            y = x * k + len(log)
        return y * 10 + len(log)

    eager_log, log = [], []
    expected = f(torch.ones(2), eager_log)
    graphs = []

    def backend(gm, ex):
        graphs.append(gm)
        return gm.forward

    out = kiln_compile(f, backend=backend, fullgraph=True)(torch.ones(2), log)
    torch.testing.assert_close(out, expected)
    assert len(graphs) == 1
    assert log == eager_log == ["enter", "exit"]


def test_contextmanager_with_a_graph_break_inside_is_correct():
    def f(x, log):
        with _scoped(log, 2) as k:
            y = x * k
            print(end="")  # graph break inside the block
            y = y + len(log)
        return y * 10 + len(log)

    eager_log, log = [], []
    expected = f(torch.ones(2), eager_log)
    out = kiln_compile(f, backend="eager")(torch.ones(2), log)
    torch.testing.assert_close(out, expected)
    assert log == eager_log


# -- NumPy scalars ---------------------------------------------------------------------------

def test_numpy_scalars_are_guarded_constants():
    np = pytest.importorskip("numpy")
    scale = {"s": np.float32(2.0)}

    def f(x):
        return x * scale["s"] + np.float64(0.5) * np.pi

    gm = one_graph(f, torch.randn(3))
    assert "np." not in gm.code  # the graph code names no module it does not import
    scale["s"] = np.float32(3.0)  # CONSTANT_MATCH on the value: recompiles, stays correct
    compiled = kiln_compile(f, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(3)), f(torch.ones(3)))


def test_dict_update_from_pairs():
    def f(x):
        d = {"a": 1}
        d.update([("b", x), ("c", x * 2)])
        d.update([("a", 3)], z=4)
        return d["b"] + d["c"] * d["a"] + d["z"]

    one_graph(f, torch.randn(3))


_lru_calls = []


@functools.lru_cache
def _feature_available(name):
    _lru_calls.append(name)
    return name == "yes"


@functools.cache
def _scale_of(x):
    return x * 2


def test_lru_cache_functions():
    """Constant arguments: called while tracing, the cached constant is folded; tensor
    arguments: ``__wrapped__`` is inlined."""

    def f(x):
        y = x + 1 if _feature_available("yes") else x - 1
        return _scale_of(y) + (2 if _feature_available("no") else 3)

    gm = one_graph(f, torch.randn(3))
    assert "_feature_available" not in gm.code
    assert _lru_calls == ["yes", "no"]  # each computed once, by eager or by the trace
