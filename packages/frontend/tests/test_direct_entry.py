"""A one-graph frame's entry runs its graph directly (_evalframe.c note 9, direct_entry.py).

When a frame's transformed code only returns its one graph's output, the hook calls the
graph with the frame's argument slots instead of evaluating that code; ``entry_runs()[2]``
counts these runs. Whatever runs, results, errors, tracebacks and what a tracer or profiler
sees must be those of the transformed code.
"""

from __future__ import annotations

import dis
import sys
import traceback

import kiln_frontend
import pytest
import torch
from _frames import hooked, type_guard
from kiln_frontend import _evalframe as C
from kiln_frontend.direct_entry import direct_call

pytestmark = pytest.mark.usefixtures("fresh_frontend")


class Runs:
    """entry_runs() since construction: .in_frame, .called, .direct."""

    def __init__(self):
        self.start = C.entry_runs()

    def _since(self, i):
        return C.entry_runs()[i] - self.start[i]

    in_frame = property(lambda self: self._since(0))
    called = property(lambda self: self._since(1))
    direct = property(lambda self: self._since(2))


def recording():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend, graphs


def add3(a, b, c):
    return a + b * c


def subset_out_of_order(a, b, c):
    return c * 2 - a


def kwonly(x, y=1, *, z):
    return x * y + z


def two_outputs(a, b):
    return a + 1, b * 2


def test_a_one_graph_function_runs_its_graph_directly():
    backend, graphs = recording()
    compiled = kiln_frontend.optimize(backend)(add3)
    args = [torch.randn(4, 8) for _ in range(3)]
    runs = Runs()
    for _ in range(3):
        torch.testing.assert_close(compiled(*args), add3(*args))
    assert len(graphs) == 1
    assert (runs.in_frame, runs.called, runs.direct) == (0, 0, 3)
    (entry,) = C.cache_entries(add3.__code__)
    assert isinstance(entry[3], C.DirectCall) and entry[3].slots == (0, 1, 2)


def test_slots_taken_out_of_order_or_some_of_them_and_keyword_only():
    backend, graphs = recording()
    a, b, c = (torch.randn(5) for _ in range(3))
    f = kiln_frontend.optimize(backend)(subset_out_of_order)
    g = kiln_frontend.optimize(backend)(kwonly)
    runs = Runs()
    for _ in range(2):
        torch.testing.assert_close(f(a, b, c), subset_out_of_order(a, b, c))
        torch.testing.assert_close(g(a, 3, z=c), kwonly(a, 3, z=c))
    assert runs.direct == 4
    (entry,) = C.cache_entries(subset_out_of_order.__code__)
    assert sorted(entry[3].slots) == [0, 2]
    (entry,) = C.cache_entries(kwonly.__code__)
    assert sorted(entry[3].slots) == [0, 2]


def test_a_module_forward_runs_its_graph_directly():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    backend, graphs = recording()
    compiled = kiln_frontend.optimize(backend)(model)
    x = torch.randn(2, 8)
    with torch.no_grad():
        compiled(x)
        runs = Runs()
        torch.testing.assert_close(compiled(x), model(x))
    assert runs.direct == 1 and len(graphs) == 1


def test_code_that_is_more_than_the_call_keeps_its_frame():
    backend, graphs = recording()
    f = kiln_frontend.optimize(backend)(two_outputs)
    a, b = torch.randn(3), torch.randn(3)
    runs = Runs()
    for _ in range(2):
        out = f(a, b)
        torch.testing.assert_close(out, two_outputs(a, b))
    assert runs.direct == 0 and runs.in_frame == 2
    (entry,) = C.cache_entries(two_outputs.__code__)
    assert len(entry) == 3


def test_direct_call_reads_only_the_exact_shape():
    def not_compiled(a):
        return a

    assert direct_call(not_compiled) is None
    assert direct_call(len) is None


def raising_backend(gm, example_inputs):
    def run(*args):
        raise ValueError("graph failed")

    return run


def test_an_error_in_the_graph_has_the_users_function_in_its_traceback():
    compiled = kiln_frontend.optimize(raising_backend)(add3)
    args = [torch.randn(2) for _ in range(3)]
    for _attempt in range(2):  # the first call (a miss) and a hit
        runs = Runs()
        with pytest.raises(ValueError, match="graph failed") as info:
            compiled(*args)
        assert runs.direct == 1
        frames = traceback.extract_tb(info.value.__traceback__)
        # the user's function sits between the caller and the graph, as its frame did,
        # at the line the transformed code gives its call
        (call,) = [i.positions.lineno for i in dis.get_instructions(
            C.cache_entries(add3.__code__)[0][1]) if i.opname == "CALL"]
        assert [(f.name, f.filename, f.lineno) for f in frames[-2:]] == [
            ("add3", __file__, call), ("run", __file__, raising_backend.__code__.co_firstlineno + 2)]


def multi_output_backend(gm, example_inputs):
    def run(*args):
        return list(gm.forward(*args)) * 2

    return run


def not_iterable_backend(gm, example_inputs):
    return lambda *args: 3


def list_backend(gm, example_inputs):
    return lambda *args: list(gm.forward(*args))


def test_the_graph_output_is_unpacked_as_unpack_sequence_does():
    args = [torch.randn(2) for _ in range(3)]
    torch.testing.assert_close(kiln_frontend.optimize(list_backend)(add3)(*args), add3(*args))
    with pytest.raises(ValueError, match="too many values to unpack"):
        kiln_frontend.optimize(multi_output_backend)(add3)(*args)
    kiln_frontend.reset()
    with pytest.raises(TypeError, match="cannot unpack non-iterable int object"):
        kiln_frontend.optimize(not_iterable_backend)(add3)(*args)


def test_under_a_profiler_or_tracer_the_frame_runs_as_before():
    backend, graphs = recording()
    compiled = kiln_frontend.optimize(backend)(add3)
    args = [torch.randn(2) for _ in range(3)]
    compiled(*args)
    for install in (sys.setprofile, sys.settrace):
        seen = []

        def tracer(frame, event, arg, seen=seen):
            if event == "call":
                seen.append(frame.f_code.co_name)
            return None

        runs = Runs()
        install(tracer)
        try:
            out = compiled(*args)
        finally:
            install(None)
        torch.testing.assert_close(out, add3(*args))
        assert (runs.direct, runs.in_frame) == (0, 1), install
        assert "add3" in seen, (install, seen)
    runs = Runs()
    compiled(*args)
    assert runs.direct == 1


def test_the_graph_may_drop_its_own_entry():
    def resetting_backend(gm, example_inputs):
        def run(*args):
            kiln_frontend.reset()  # drops the entry (and its DirectCall) while it runs
            return gm.forward(*args)

        return run

    compiled = kiln_frontend.optimize(resetting_backend)(add3)
    args = [torch.randn(2) for _ in range(3)]
    for _ in range(3):
        torch.testing.assert_close(compiled(*args), add3(*args))


def test_a_callback_may_give_a_direct_call_of_its_own():
    def double(a):
        return (a * 2,)

    def callback(info):
        if info.code.co_name != "plain":
            return None
        return type_guard(info.args), lambda a, b: -1, C.DirectCall(double, (0,), 1)

    def plain(a, b):
        return a + b

    runs = Runs()
    assert hooked(callback, plain, 5, 6) == 10
    assert hooked(callback, plain, 7, 6) == 14
    assert runs.direct == 2
    with pytest.raises(TypeError, match="DirectCall or None"):
        hooked(lambda info: (type_guard(info.args), plain, "x")
               if info.code.co_name == "plain" else None, plain, 1, 2)
    with pytest.raises(ValueError):
        C.DirectCall(double, (-1,), 1)
