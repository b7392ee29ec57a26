"""A cache entry's fn runs in the intercepted frame itself (_evalframe.c, note 8).

When fn takes its arguments in the same slots as the frame's code (what the capture layer's
transformed code does) and the thread's data-stack chunk has room for fn's frame, the hook
re-initializes the unrun frame as fn's and evaluates it, instead of calling fn (a second
frame, the arguments copied, a second pass through the hook). ``entry_runs()`` counts the
two ways; whichever runs, the result, the arguments, closures, tracebacks and frame objects
must be those of ``fn(*args)``.
"""

from __future__ import annotations

import sys
import traceback
import types

import _frames
import pytest
from _frames import cell_arg, fact, hooked, make_closure
from kiln_frontend import _evalframe as C

pytestmark = pytest.mark.usefixtures("clean_eval_frame_hook")


def same_layout_copy(info, suffix="_copy"):
    """fn for info's frame: a function of a copy of its code (same argument layout, so it
    fits the intercepted frame), bound to the frame's closure."""
    code = info.code.replace(co_name=info.code.co_name + suffix)
    return types.FunctionType(code, info.globals, code.co_name, None, info.closure)


class SameLayout:
    """A callback compiling the codes named in ``only`` to a same-layout copy of the code."""

    def __init__(self, only, make=same_layout_copy):
        self.only, self.make, self.asked = only, make, []

    def __call__(self, info):
        self.asked.append(info.code.co_name)
        if info.code.co_name not in self.only:
            return None
        return _frames.type_guard(info.args), self.make(info)


class Runs:
    """entry_runs() since construction: .in_frame, .called."""

    def __init__(self):
        self.start = C.entry_runs()

    @property
    def in_frame(self):
        return C.entry_runs()[0] - self.start[0]

    @property
    def called(self):
        return C.entry_runs()[1] - self.start[1]


def add(a, b):
    return a + b


def all_kinds(a, b=2, /, c=3, *args, d, e=5, **kwargs):
    return (a, b, c, args, d, e, kwargs)


def caller_of(fn, *args):
    return fn(*args)


def test_hits_run_in_the_frame_with_no_frame_between_caller_and_fn():
    seen = []

    def traced_add(a, b):
        frame = sys._getframe()
        seen.append((frame.f_code.co_name, frame.f_back.f_code.co_name))
        return a + b

    runs = Runs()
    cb = SameLayout({"add"}, make=lambda info: traced_add)
    assert [hooked(cb, caller_of, add, i, 1) for i in range(5)] == [1, 2, 3, 4, 5]
    assert cb.asked.count("add") == 1  # (other frames, e.g. an audit hook, may be asked too)
    # the first call's new entry and the four hits: each ran in add's own frame
    assert (runs.in_frame, runs.called) == (5, 0)
    assert seen == [("traced_add", "caller_of")] * 5


def test_every_argument_kind_and_default_reaches_fn_in_the_frame():
    runs = Runs()
    cb = SameLayout({"all_kinds"})
    for args, kwargs in [((1, 2, 3, 4), {"d": 5, "z": 6}), ((1,), {"d": 0}),
                         ((7, 8), {"d": 9, "e": 10})]:
        assert hooked(cb, all_kinds, *args, **kwargs) == all_kinds(*args, **kwargs)
    assert runs.in_frame == 3 and runs.called == 0


def test_cells_and_closures_in_the_frame():
    runs = Runs()
    cb = SameLayout({"closed", "cell_arg"})
    assert hooked(cb, make_closure(10), 1) == 11
    # a closure made anew: the cached fn is rebound to this frame's cells
    assert hooked(cb, make_closure(20), 1) == 21
    assert hooked(cb, cell_arg, 1) == 2
    assert hooked(cb, cell_arg, 5) == 6
    assert runs.in_frame == 4 and runs.called == 0


def test_a_fn_of_another_argument_layout_is_called():
    def varargs_fn(*args):
        return args[0] + args[1]

    runs = Runs()
    cb = SameLayout({"add"}, make=lambda info: varargs_fn)
    assert [hooked(cb, add, i, 2) for i in range(3)] == [2, 3, 4]
    assert (runs.in_frame, runs.called) == (0, 3)


def test_recursion_through_the_frame_crosses_data_stack_chunks():
    runs = Runs()
    cb = SameLayout({"fact"})
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    assert hooked(cb, fact, 250) == fact(250)
    # fact_copy's frames call fact: every level is a hook hit
    assert runs.in_frame + runs.called == 250 and runs.in_frame > 0


BIG = 400  # locals of big_add: its frame is much larger than add's


exec("def big_add(a, b):\n" + "".join(f"    v{i} = a\n" for i in range(BIG))
     + "    return a + b + v0 - v0\n")


def pad(depth, fn, *args):
    """Uses the data stack `depth` frames deep, then calls fn."""
    if depth == 0:
        return fn(*args)
    return pad(depth - 1, fn, *args)


def test_a_larger_fn_frame_runs_in_the_frame_where_the_chunk_has_room_else_is_called():
    runs = Runs()
    cb = SameLayout({"add"}, make=lambda info: big_add)  # noqa: F821 - made by exec
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    for depth in range(600):
        assert hooked(cb, pad, depth, add, depth, 1) == depth + 1
    # the sweep puts add's frame at every distance from its chunk's end: where big_add's
    # frame would pass the end it is called, elsewhere the frame grows in place
    assert runs.in_frame + runs.called == 600
    assert runs.in_frame > 0 and runs.called > 0


def raising_copy(a, b):
    raise ValueError(f"bad {a}")


def test_an_exception_in_the_frame_propagates_with_fn_in_the_traceback():
    runs = Runs()
    cb = SameLayout({"add"}, make=lambda info: raising_copy)
    with pytest.raises(ValueError, match="bad 1") as exc:
        hooked(cb, caller_of, add, 1, 2)
    names = [f.name for f in traceback.extract_tb(exc.value.__traceback__)]
    assert names[-2:] == ["caller_of", "raising_copy"]
    assert runs.in_frame == 1
    assert hooked(cb, caller_of, fact, 5) == 120  # the hook and data stack still healthy


def test_a_frame_object_of_the_frame_outlives_it():
    kept = []

    def keeping_add(a, b):
        kept.append(sys._getframe())
        total = a + b
        return total

    runs = Runs()
    cb = SameLayout({"add"}, make=lambda info: keeping_add)
    assert hooked(cb, add, 3, 4) == 7
    assert runs.in_frame == 1
    (frame,) = kept
    assert frame.f_code is keeping_add.__code__
    assert {k: frame.f_locals[k] for k in ("a", "b", "total")} == {"a": 3, "b": 4, "total": 7}


def test_a_kiln_compiled_function_hit_runs_in_the_frame():
    torch = pytest.importorskip("torch")
    import kiln_frontend

    def add3(a, b, c):
        # more than the graph's one output (that entry calls its graph directly:
        # test_direct_entry.py)
        return a + b * c, 0

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    args = [torch.randn(4, 8) for _ in range(3)]
    compiled = kiln_frontend.optimize(backend)(add3)
    compiled(*args)
    runs = Runs()
    for _ in range(3):
        torch.testing.assert_close(compiled(*args), add3(*args))
    assert len(graphs) == 1
    assert (runs.in_frame, runs.called) == (3, 0)
