"""The C eval-frame hook (kiln_frontend._evalframe) on its own: no torch needed.

The callbacks here build cache entries from plain Python: ``fn`` is the frame's function
rebuilt from a copy of its code that takes every argument slot positionally (what the
capture layer's transformed code does), ``check_fn`` checks the arguments' types.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import sys
import threading
import types
import weakref

import _frames
import pytest
from _frames import cell_arg, fact, hooked, make_closure
from kiln_frontend import _evalframe as C

pytestmark = pytest.mark.usefixtures("clean_eval_frame_hook")


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def slot_function(info, name=None):
    """A function with a copy of info.code taking all argument slots positionally."""
    co = info.code
    n = len(info.args)
    flags = co.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    new_code = co.replace(
        co_argcount=n, co_posonlyargcount=0, co_kwonlyargcount=0, co_flags=flags,
        co_name=name or co.co_name,
    )
    return types.FunctionType(new_code, info.globals, new_code.co_name, None, info.closure)


def type_guard(info):
    return _frames.type_guard(info.args)


class Recorder:
    """A callback recording the codes it is asked about and returning type-guarded entries."""

    def __init__(self, only=None, fn_calls=None):
        self.seen = []
        self.only = only  # set of code names to compile; others return None
        self.fn_calls = fn_calls if fn_calls is not None else []

    def __call__(self, info):
        self.seen.append(info)
        if self.only is not None and info.code.co_name not in self.only:
            return None
        compiled = slot_function(info)
        calls = self.fn_calls

        # counts executions; the C side marks fn's code skip, we mark compiled's
        def fn(*args):
            calls.append(info.code.co_name)
            return compiled(*args)

        C.skip_code(compiled.__code__)
        return type_guard(info), fn

    def names(self):
        return [i.code.co_name for i in self.seen]


# --------------------------------------------------------------------------------------
# functions under test (module level: their code objects are stable)
# --------------------------------------------------------------------------------------


def add(a, b):
    return a + b


def all_kinds(a, b=2, /, c=3, *args, d, e=5, **kwargs):
    return (a, b, c, args, d, e, kwargs)


def outer(x):
    return inner(x) * 2


def inner(x):
    return x + 1


def gen(n):
    yield from range(n)


async def coro(x):
    return x + 1


async def agen(n):
    for i in range(n):
        yield i


def raises(x):
    raise ValueError(f"bad {x}")


# --------------------------------------------------------------------------------------
# basics
# --------------------------------------------------------------------------------------


def test_default_state_is_off():
    assert C.get_eval_frame() is None
    assert not C.hook_installed()


def test_set_eval_frame_returns_previous_and_validates():
    cb = Recorder()
    assert C.set_eval_frame(cb) is None
    assert C.hook_installed()
    assert C.set_eval_frame(False) is cb
    assert C.set_eval_frame(None) is False
    assert not C.hook_installed()
    with pytest.raises(TypeError):
        C.set_eval_frame(42)


def test_callback_once_per_code_then_cache_hits():
    fn_calls = []
    cb = Recorder(only={"add"}, fn_calls=fn_calls)
    results = [hooked(cb, add, i, 1) for i in range(5)]
    assert results == [1, 2, 3, 4, 5]
    assert cb.names() == ["add"]
    assert fn_calls == ["add"] * 5  # every call ran through the cached fn
    entries = C.cache_entries(add.__code__)
    assert len(entries) == 1
    check_fn, fn, owner = entries[0]
    assert check_fn.expected == (int, int)
    assert owner is cb  # the callback that compiled the entry owns it
    assert C.is_skipped(fn.__code__)


def test_guard_failure_adds_second_entry():
    cb = Recorder(only={"add"})
    assert hooked(cb, add, 1, 2) == 3
    assert hooked(cb, add, "a", "b") == "ab"
    assert hooked(cb, add, 3, 4) == 7
    assert hooked(cb, add, "c", "d") == "cd"
    assert cb.names() == ["add", "add"]
    assert [e[0].expected for e in C.cache_entries(add.__code__)] == [(int, int), (str, str)]


def test_frame_info_fields():
    cb = Recorder(only=set())
    hooked(cb, all_kinds, 1, 2, 3, 4, d=5, z=6)
    (info,) = cb.seen
    assert isinstance(info, C.FrameInfo)
    assert info.code is all_kinds.__code__
    assert info.func is all_kinds
    assert info.globals is globals()
    assert info.builtins is __builtins__ or info.builtins is getattr(__builtins__, "__dict__", None)
    assert info.closure is None
    # positional, keyword-only, *args tuple, **kwargs dict; defaults already applied
    assert info.args == (1, 2, 3, 5, 5, (4,), {"z": 6})
    assert "all_kinds" in repr(info)


def test_all_argument_kinds_reach_fn():
    cb = Recorder(only={"all_kinds"})
    expected = all_kinds(1, 2, 3, 4, d=5, z=6)
    assert hooked(cb, all_kinds, 1, 2, 3, 4, d=5, z=6) == expected
    assert hooked(cb, all_kinds, 1, d=0) == all_kinds(1, d=0)
    assert len(C.cache_entries(all_kinds.__code__)) == 1


def test_closure_and_cell_arguments():
    closed = make_closure(10)
    cb = Recorder(only={"closed", "cell_arg"})
    assert hooked(cb, closed, 1) == 11
    assert hooked(cb, closed, 2) == 12
    assert cb.seen[0].closure is closed.__closure__
    assert hooked(cb, cell_arg, 1) == 2
    assert hooked(cb, cell_arg, 5) == 6
    assert cb.names() == ["closed", "cell_arg", "get"]  # get: called from fn, seen once


def test_methods_are_seen_with_self():
    class A:
        def __init__(self, k):
            self.k = k

        def method(self, x):
            return self.k * x

    cb = Recorder(only={"method"})
    a = A(3)
    assert hooked(cb, a.method, 2) == 6
    assert hooked(cb, A(4).method, 2) == 8  # same types: cache hit
    infos = [i for i in cb.seen if i.code.co_name == "method"]
    assert len(infos) == 1 and infos[0].args[0] is a


# --------------------------------------------------------------------------------------
# skip marks, None from the callback, reset
# --------------------------------------------------------------------------------------


def test_callback_returning_none_marks_skip():
    cb = Recorder(only=set())
    for _ in range(3):
        assert hooked(cb, add, 1, 2) == 3
    assert cb.names() == ["add"]
    assert C.is_skipped(add.__code__)
    assert C.cache_entries(add.__code__) == []


def test_callback_returning_false_runs_the_frame_and_asks_again():
    """False is "not now": the frame runs as is, no skip mark, the next call asks again."""
    answers = [False, False]
    seen = []

    def cb(info):
        seen.append(info.code.co_name)
        return answers.pop(0) if answers else None

    for _ in range(3):
        assert hooked(cb, add, 1, 2) == 3
    assert seen == ["add", "add", "add"]
    assert C.is_skipped(add.__code__)  # the third answer was None


def test_skip_and_unskip_code():
    cb = Recorder(only={"add"})
    C.skip_code(add.__code__)
    assert hooked(cb, add, 1, 2) == 3
    assert cb.seen == []
    C.unskip_code(add.__code__)
    assert hooked(cb, add, 1, 2) == 3
    assert cb.names() == ["add"]
    with pytest.raises(TypeError):
        C.skip_code("not code")


def test_clear_cache_and_reset():
    cb = Recorder(only={"add"})
    hooked(cb, add, 1, 2)
    C.skip_code(inner.__code__)
    assert C.cache_entries(add.__code__)
    C.clear_cache(add.__code__)
    assert C.cache_entries(add.__code__) == []
    hooked(cb, add, 1, 2)
    assert cb.names() == ["add", "add"]
    C.reset()
    assert C.cache_entries(add.__code__) == []
    assert not C.is_skipped(inner.__code__)
    fn_code = None
    hooked(cb, add, 1, 2)
    fn_code = C.cache_entries(add.__code__)[0][1].__code__
    C.reset()
    assert not C.is_skipped(fn_code)


def test_reset_releases_entries():
    cb = Recorder(only={"add"})
    hooked(cb, add, 1, 2)
    check_fn, fn, _owner = C.cache_entries(add.__code__)[0]
    refs = weakref.ref(check_fn), weakref.ref(fn)
    del check_fn, fn, _owner
    C.reset()
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


def test_code_extra_freed_with_code_object():
    src = "def temp(x):\n    return x * 2\n"
    ns = {}
    exec(compile(src, "<temp>", "exec"), ns)
    assert hooked(plain_callback, ns["temp"], 4) == 8
    check_fn, *_ = C.cache_entries(ns["temp"].__code__)[0]
    ref = weakref.ref(check_fn)
    del check_fn, _
    ns.clear()
    gc.collect()
    assert ref() is None
    C.reset()  # the freed extra is no longer on reset()'s list


# --------------------------------------------------------------------------------------
# frames we never intercept
# --------------------------------------------------------------------------------------


def test_generators_coroutines_async_generators_untouched():
    cb = Recorder()
    assert hooked(cb, lambda: list(gen(4))) == [0, 1, 2, 3]
    assert hooked(cb, lambda: asyncio.run(coro(1))) == 2

    async def collect():
        return [i async for i in agen(3)]

    assert hooked(cb, lambda: asyncio.run(collect())) == [0, 1, 2]
    names = set(cb.names())
    assert not names & {"gen", "coro", "agen", "collect"}
    assert "<lambda>" in names


def test_module_level_code_untouched():
    cb = Recorder()
    ns = {}
    hooked(cb, exec, "y = 1 + 1", ns)
    assert ns["y"] == 2
    assert all(i.code.co_name != "<module>" for i in cb.seen)


def test_fn_must_not_share_the_frame_code():
    def cb(info):
        return (lambda *a: True), info.func

    with pytest.raises(ValueError, match="code object of its own"):
        hooked(cb, add, 1, 2)


def test_bad_callback_result_raises_type_error():
    with pytest.raises(TypeError, match="check_fn, fn"):
        hooked(lambda info: 42, add, 1, 2)
    with pytest.raises(TypeError):
        hooked(lambda info: (1, 2, 3), add, 1, 2)


# --------------------------------------------------------------------------------------
# modes: run-only, off
# --------------------------------------------------------------------------------------


def test_run_only_mode_uses_cache_never_calls_callback():
    fn_calls = []
    cb = Recorder(only={"add"}, fn_calls=fn_calls)
    hooked(cb, add, 1, 2)
    assert fn_calls == ["add"]
    # run-only: the cached entry is used when its guard passes ...
    assert hooked(False, add, 5, 6) == 11
    assert fn_calls == ["add", "add"]
    # ... and a miss runs the frame as is, without compiling or marking skip
    assert hooked(False, add, "x", "y") == "xy"
    assert hooked(False, outer, 1) == 4
    assert len(C.cache_entries(add.__code__)) == 1
    assert not C.is_skipped(add.__code__) and not C.is_skipped(outer.__code__)
    assert cb.names() == ["add"]


def test_hook_off_outside_optimized_regions():
    cb = Recorder()
    hooked(cb, add, 1, 2)
    n = len(cb.seen)
    assert not C.hook_installed()
    add(3, 4)
    outer(2)
    assert len(cb.seen) == n
    # None inside a hooked region turns it off for the nested calls
    def region():
        prev = C.set_eval_frame(None)
        try:
            return inner(1)
        finally:
            C.set_eval_frame(prev)

    cb2 = Recorder(only=set())
    hooked(cb2, region)
    assert cb2.names() == ["region"]


def test_run_without_hook():
    cb = Recorder()
    wrapped = C.run_without_hook(outer)
    assert wrapped.__wrapped__ is outer
    assert hooked(cb, wrapped, 1) == 4
    assert cb.seen == []
    assert hooked(cb, wrapped, x=2) == 6
    with pytest.raises(TypeError):
        C.run_without_hook(3)
    assert "outer" in repr(wrapped)


def tree_root(x, compiled_add):
    return inner(x) + compiled_add(x, 1)


def test_skip_code_tree_runs_callees_as_is():
    """A SKIP_TREE code (what torch keeps from TorchDynamo): neither it nor what it calls is
    seen, except a with_callback call inside (a kiln-compiled function); the mark is a rule
    kept across reset(), and skip_code() does not weaken it."""
    cb = Recorder(only={"inner", "add"})
    compiled_add = C.with_callback(cb, add)
    C.skip_code_tree(tree_root.__code__)
    try:
        for rounds in (1, 2):
            assert hooked(cb, tree_root, 1, compiled_add) == 4
            assert cb.names() == ["add"] * rounds  # (compiled again after each reset)
            C.reset()
            C.skip_code(tree_root.__code__)
            assert C.is_skipped(tree_root.__code__)
        assert hooked(cb, inner, 1) == 2  # outside the tree, inner is seen as usual
        assert cb.names()[-1] == "inner"
    finally:
        C.unskip_code(tree_root.__code__)


def test_a_callback_marking_the_code_tree_runs_that_first_frame_as_a_tree():
    """A callback that marks the code it was asked about SKIP_TREE and answers None: that
    very frame already runs with its callees unseen (kiln marks torch.compiler.disable's
    wrapper when it first meets it)."""
    seen = []

    def cb(info):
        seen.append(info.code.co_name)
        if info.code is outer.__code__:
            C.skip_code_tree(outer.__code__)
        return None

    try:
        assert hooked(cb, outer, 1) == 4
        assert seen == ["outer"]  # inner, called by the first frame of outer, was not seen
    finally:
        C.unskip_code(outer.__code__)


# --------------------------------------------------------------------------------------
# nesting, recursion, exceptions
# --------------------------------------------------------------------------------------


def test_frames_called_from_fn_are_seen():
    fn_calls = []
    cb = Recorder(only={"outer", "inner"}, fn_calls=fn_calls)
    assert hooked(cb, outer, 1) == 4
    assert cb.names() == ["outer", "inner"]
    assert hooked(cb, outer, 2) == 6
    assert fn_calls == ["outer", "inner", "outer", "inner"]


def test_recursion_through_the_cache():
    fn_calls = []
    cb = Recorder(only={"fact"}, fn_calls=fn_calls)
    assert hooked(cb, fact, 20) == fact(20)
    assert cb.names() == ["fact"]
    assert len(fn_calls) == 20
    # deep enough to cross several data-stack chunks
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    assert hooked(cb, fact, 250) == fact(250)


def test_runaway_recursion_raises_recursion_error():
    cb = Recorder(only={"fact"})

    def forever(n):
        return forever(n + 1)

    cb.only.add("forever")
    with pytest.raises(RecursionError):
        hooked(cb, forever, 0)
    assert hooked(cb, fact, 5) == 120  # still healthy afterwards


def test_exception_from_frame_propagates():
    cb = Recorder(only={"raises"})
    for _ in range(2):  # miss, then hit
        with pytest.raises(ValueError, match="bad 1"):
            hooked(cb, raises, 1)
    assert len(C.cache_entries(raises.__code__)) == 1


def test_exception_from_callback_propagates():
    def cb(info):
        raise KeyError("from callback")

    with pytest.raises(KeyError, match="from callback"):
        hooked(cb, add, 1, 2)
    assert C.cache_entries(add.__code__) == []
    assert not C.is_skipped(add.__code__)


def test_exception_from_guard_propagates():
    cb = Recorder(only={"add"})
    hooked(cb, add, 1, 2)

    def bad_check(*args):
        raise RuntimeError("guard exploded")

    C.clear_cache(add.__code__)

    def cb2(info):
        return bad_check, slot_function(info)

    hooked(cb2, add, 1, 2)  # first call: entry added, fn runs
    with pytest.raises(RuntimeError, match="guard exploded"):
        hooked(cb2, add, 1, 2)


def test_hook_is_off_while_callback_and_guards_run():
    seen_inside = []

    def check(*args):
        inner(0)  # would be a new frame for the hook if it were on
        seen_inside.append(C.get_eval_frame())
        return True

    calls = []

    def cb(info):
        calls.append(info.code.co_name)
        inner(0)
        return check, slot_function(info)

    hooked(cb, add, 1, 2)
    hooked(cb, add, 1, 2)
    assert calls == ["add"]  # inner() called from callback/guard never reached the callback


def plain_callback(info):
    """Entries that keep no reference to the frame's arguments (unlike Recorder's)."""
    compiled = slot_function(info)
    C.skip_code(compiled.__code__)
    return (lambda *args: True), compiled


def test_no_reference_leaks_on_hits_misses_and_errors():
    obj = object()
    ident = lambda a, b: a  # noqa: E731

    def first(a, b):
        return a

    def run_all():
        hooked(plain_callback, first, obj, 1)  # miss then hits
        hooked(False, ident, obj, 2)  # run-only miss
        try:
            hooked(plain_callback, raises, obj)  # error raised by fn
        except ValueError:
            pass
        try:
            hooked(lambda info: 1 / 0, ident, obj, 3)  # error raised by the callback
        except ZeroDivisionError:
            pass

    run_all()
    gc.collect()
    base = sys.getrefcount(obj)
    for _ in range(200):
        run_all()
    gc.collect()
    assert sys.getrefcount(obj) == base


def test_many_calls_do_not_grow_memory():
    import tracemalloc

    hooked(plain_callback, add, 1, 2)
    prev = C.set_eval_frame(plain_callback)
    try:
        for _ in range(1000):
            add(1, 2)
        tracemalloc.start()
        snap1 = tracemalloc.take_snapshot()
        for _ in range(20000):
            add(1, 2)
        snap2 = tracemalloc.take_snapshot()
        tracemalloc.stop()
    finally:
        C.set_eval_frame(prev)
    growth = sum(s.size_diff for s in snap2.compare_to(snap1, "filename"))
    assert growth < 16 * 1024


# --------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------


def test_callback_is_per_thread():
    cb = Recorder()
    other_seen = []
    started = threading.Event()
    release = threading.Event()

    def other():
        other_seen.append(C.get_eval_frame())
        started.set()
        release.wait(5)
        inner(1)  # the hook is installed (by the main thread) but this thread has no callback
        other_seen.append(C.get_eval_frame())

    prev = C.set_eval_frame(cb)
    try:
        t = threading.Thread(target=other)
        t.start()
        started.wait(5)
        release.set()
        t.join(5)
        add(1, 2)
    finally:
        C.set_eval_frame(prev)
    assert other_seen == [None, None]
    names = cb.names()
    assert "add" in names and "inner" not in names and "other" not in names


def test_threads_with_their_own_callbacks():
    results = {}
    errors = []

    def worker(k):
        try:
            cb = Recorder(only={"add"})
            results[k] = hooked(cb, lambda: [add(k, i) for i in range(50)])
            results[k, "seen"] = [n for n in cb.names() if n == "add"]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    for k in range(4):
        assert results[k] == [k + i for i in range(50)]
        # the first thread to get there compiled add; the others may hit its entry
        assert results[k, "seen"] in ([], ["add"])
    assert 1 <= len(C.cache_entries(add.__code__)) <= 4
    assert not C.hook_installed()


# --------------------------------------------------------------------------------------
# with_callback: what the decorators return
# --------------------------------------------------------------------------------------


def test_with_callback_sets_and_restores_the_callback():
    cb = Recorder(only={"add"})
    seen = []

    def probe(x):
        seen.append(C.get_eval_frame())
        return add(x, 1)

    w = C.with_callback(cb, probe)
    assert w(1) == 2 and w(x=2) == 3
    assert seen == [cb, cb]
    assert C.get_eval_frame() is None
    assert cb.names() == ["probe", "add"]
    assert w.fn is probe and w.callback is cb and "with_callback" in repr(w)

    def boom():
        raise ValueError("x")

    with pytest.raises(ValueError):
        C.with_callback(cb, boom)()
    assert C.get_eval_frame() is None and not C.hook_installed()
    with pytest.raises(TypeError):
        C.with_callback(3, probe)
    with pytest.raises(TypeError):
        C.with_callback(None, 3)


def test_with_callback_binds_like_a_function_and_takes_attributes():
    import functools

    def method(self, x):
        return (self, x, C.get_eval_frame())

    w = C.with_callback(False, method)
    functools.update_wrapper(w, method)
    assert w.__name__ == "method" and w.__wrapped__ is method
    w.extra = 1
    assert w.__dict__["extra"] == 1

    class A:
        m = w

    a = A()
    assert a.m(2) == (a, 2, False)
    bound = a.m
    assert bound(3) == (a, 3, False)
    assert A.m is w
    assert C.get_eval_frame() is None
