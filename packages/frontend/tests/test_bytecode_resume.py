"""make_resume_code: continuation functions that pick up a frame mid-way, with values on the
stack, live locals, loops, exception handlers and closures.  Pure Python (no torch)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
import types

import pytest
from _bytecode_support import bc

versions = bc.versions
builders = bc.builders


def _find(fn, pred, nth=0):
    """(instruction, stack depth before it) of the nth instruction of fn matching pred."""
    insts = bc.decode(fn.__code__)
    depths = bc.stack_depths(insts)
    hits = [(i, d) for i, d in zip(insts, depths, strict=True) if pred(i)]
    return hits[nth]


def _after(fn, pred):
    """(instruction, stack depth) right after the first instruction matching pred."""
    insts = bc.decode(fn.__code__)
    depths = bc.stack_depths(insts)
    k = next(k for k, i in enumerate(insts) if pred(i)) + 1
    return insts[k], depths[k]


def _call_layout(callable_slot, *args):
    """The stack slots of a call in this version's order: 3.11/3.12 ``[NULL, callable,
    *args]``, 3.13 ``[callable, NULL, *args]`` (None stands for the NULL)."""
    if versions.NULL_ABOVE_CALLABLE:
        return [callable_slot, None, *args]
    return [None, callable_slot, *args]


def _resume_fn(fn, target, stack_vars, live, closure=None):
    code = bc.make_resume_code(fn.__code__, target, stack_vars, live,
                               f"__resume_at_{target.offset}_0")
    return types.FunctionType(code, fn.__globals__, code.co_name, None, closure)


def _g(x, y):
    return x * 10 + y


def f_call(a, b):
    x = a * 2
    y = _g(x, b + 1)
    return y + x


def test_resume_at_call_with_null_and_arguments_on_stack():
    call, depth = _find(f_call, lambda i: i.opname in ("PRECALL", "CALL"))
    assert depth == 4  # NULL, _g, x, b + 1
    fn = _resume_fn(f_call, call, _call_layout("s1", "s2", "s3"), ["x"])
    assert fn.__code__.co_argcount == 4
    assert fn(_g, 6, 5, 6) == f_call(3, 4)
    # the stack values really are used: pass a different callable
    assert fn(lambda p, q: 0, 6, 5, 6) == 6


def f_binop(a, b, c, d):
    return (a + b) * (c - d)


def test_resume_inside_binary_op():
    mul, depth = _find(f_binop, lambda i: i.opname == "BINARY_OP" and i.argrepr == "*")
    assert depth == 2
    fn = _resume_fn(f_binop, mul, ["l", "r"], [])
    assert fn(1 + 2, 7 - 3) == f_binop(1, 2, 7, 3)


def f_kw(a):
    return _g(y=a, x=a + 1)


def test_resume_at_kw_names():
    if versions.PY313:
        # 3.13: the names are a constant on the stack, below CALL_KW
        kw, depth = _find(f_kw, lambda i: i.opname == "CALL_KW")
        assert depth == 5
        fn = _resume_fn(f_kw, kw, _call_layout("f", "s1", "s2", "names"), [])
        assert fn(_g, 5, 6, ("y", "x")) == f_kw(5)
        return
    kw, depth = _find(f_kw, lambda i: i.opname == "KW_NAMES")
    assert depth == 4
    fn = _resume_fn(f_kw, kw, [None, "f", "s1", "s2"], [])
    assert fn(_g, 5, 6) == f_kw(5)


def f_for(n):
    total = 0
    for i in range(n):
        total += i * 2
        if total > 50:
            break
    else:
        total = -total
    return total


@pytest.mark.parametrize("n", [3, 10])
def test_resume_inside_for_loop_body(n):
    # at "total += i * 2": stack [iterator]; live: total, i
    target, depth = _find(f_for, lambda i: i.opname == "LOAD_FAST" and i.argval == "total", 0)
    assert depth == 1
    fn = _resume_fn(f_for, target, ["it"], ["total", "i"])
    it = iter(range(n))
    i = next(it)
    assert fn(it, 0, i) == f_for(n)


def test_resume_at_loop_head():
    head, depth = _find(f_for, lambda i: i.opname == "FOR_ITER")
    assert depth == 1
    fn = _resume_fn(f_for, head, ["it"], ["total"])
    it = iter(range(10))
    next(it), next(it)
    assert fn(it, 2) == f_for(10)
    assert fn(iter(()), 7) == -7  # exhausted iterator runs the else branch


def f_while(n):
    acc = []
    while n > 0:
        acc.append(n)
        n -= 1
    return acc


def test_resume_jumps_back_into_while_loop():
    target, depth = _find(f_while, lambda i: i.opname == "LOAD_FAST" and i.argval == "acc", 0)
    assert depth == 0
    code = bc.make_resume_code(f_while.__code__, target.offset, [], ["acc", "n"], "r")
    fn = types.FunctionType(code, {})
    assert fn([9], 3) == [9, 3, 2, 1]
    # the loop head before the target is kept (reached by the backward jump)
    assert any(bc.is_backward_jump(i) for i in bc.decode(code))


def f_try(x):
    out = []
    try:
        out.append(1)
        out.append(10 // x)
    except ZeroDivisionError:
        out.append("zde")
    finally:
        out.append("fin")
    return out


@pytest.mark.parametrize("x", [0, 5])
def test_resume_inside_try_keeps_handlers(x):
    # resume at the second append (inside the try body)
    target, depth = _find(f_try, lambda i: i.opname == "LOAD_FAST" and i.argval == "out", 1)
    assert depth == 0 and target.exn_tab_entry is not None
    fn = _resume_fn(f_try, target, [], ["out", "x"])
    assert fn([1], x) == f_try(x)
    table = bc.decode(fn.__code__)
    assert any(i.exn_tab_entry is not None for i in table)


class _CM:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, val, tb):
        self.log.append(("exit", typ))
        return typ is KeyError


def f_with(log, fail):
    with _CM(log) as cm:
        cm.log.append("body")
        if fail:
            raise KeyError(fail)
    log.append("after")
    return log


@pytest.mark.parametrize("fail", [None, "k"])
def test_resume_inside_with_block(fail):
    # in the body the stack holds the bound __exit__
    target, depth = _find(f_with, lambda i: i.opname == "LOAD_FAST" and i.argval == "cm")
    assert depth == 1
    fn = _resume_fn(f_with, target, ["exit"], ["log", "fail", "cm"])
    log = ["enter"]
    cm = _CM(log)
    assert fn(cm.__exit__, log, fail, cm) == f_with([], fail)


def f_cells(v):
    def get():
        return v

    v = v + 1
    return get, v * 2


def test_resume_shares_cells_with_closures():
    target, depth = _find(f_cells, lambda i: i.opname == "LOAD_DEREF" and i.argval == "v")
    assert depth == 0
    code = bc.make_resume_code(f_cells.__code__, target, [], ["get"], "r")
    assert code.co_freevars == ("v",) and code.co_cellvars == ()
    cell = types.CellType(5)
    inner = next(c for c in f_cells.__code__.co_consts if isinstance(c, types.CodeType))
    get = types.FunctionType(inner, globals(), "get", None, (cell,))
    fn = types.FunctionType(code, globals(), "r", None, (cell,))
    got, doubled = fn(get)
    assert got is get and doubled == 12 and cell.cell_contents == 6 and get() == 6
    # a cell variable listed as live keeps its argument position but reads the cell
    code2 = bc.make_resume_code(f_cells.__code__, target, [], ["v", "get"], "r")
    assert code2.co_argcount == 2
    fn2 = types.FunctionType(code2, globals(), "r", None, (types.CellType(1),))
    got, doubled = fn2("ignored", get)
    assert got is get and doubled == 4


def _make_nested():
    scale = 3

    def nested(xs):
        total = 0

        def add(v):
            nonlocal total
            total += v * scale

        for x in xs:
            add(x)
        return total

    return nested


def test_resume_with_free_and_cell_variables():
    nested = _make_nested()
    code = nested.__code__
    assert code.co_freevars == ("scale",) and code.co_cellvars
    target, depth = _after(nested, lambda i: i.opname == "STORE_FAST" and i.argval == "x")
    assert depth == 1  # the iterator
    rc = bc.make_resume_code(code, target, ["it"], ["add", "x"], "r")
    assert rc.co_freevars == code.co_cellvars + code.co_freevars
    total_cell = types.CellType(100)

    def add(v):  # a stand-in closure over the same cell
        total_cell.cell_contents += v * 3

    closure = (total_cell, nested.__closure__[0])
    fn = types.FunctionType(rc, globals(), "r", None, closure)
    assert fn(iter([2, 3]), add, 1) == 100 + 3 * (1 + 2 + 3)


def f_graph_break(a, b):
    c = a + b
    d = [c, a]
    e = len(d) + c  # "graph break" at len(...)'s call
    return e * 2, d


def test_simulated_graph_break_builds_resume_function_in_frame():
    """What the capture layer does: spill the stack to temporaries, build the resume
    function in the frame (make_function with its closure), call it, return its result."""
    fn_src = f_graph_break
    call, depth = _find(fn_src, lambda i: i.opname in ("PRECALL", "CALL"))
    assert depth == 3  # NULL, len, d
    layout = _call_layout("s1", "s2")
    rc = bc.make_resume_code(fn_src.__code__, call, layout, ["c", "d"],
                             f"__resume_at_{call.offset}_1")

    def transform(insts, options):
        k = next(i for i, inst in enumerate(insts) if inst.offset == call.offset)
        # spill the stack, top first (the NULL into a local of its own, which it leaves
        # unbound), then call the resume function: [NULL, resume_fn, s1, s2, c, d]
        spill = []
        for slot in reversed(layout):
            spill += builders.store_fast("__tmp_null" if slot is None else f"__tmp_{slot}")
        make = builders.push_null() + builders.make_function(rc, rc.co_freevars)
        call_it = (builders.load_fast("__tmp_s1") + builders.load_fast("__tmp_s2")
                   + builders.load_fast("c") + builders.load_fast("d")
                   + builders.call_function(4) + builders.return_value())
        insts[k:] = spill + make + call_it

    new = types.FunctionType(bc.transform_code(fn_src.__code__, transform), globals())
    assert new(2, 3) == fn_src(2, 3)


def _cellular(a):
    def peek():
        return a

    a = a * 10
    b = peek() + 1
    return a + b


def test_simulated_graph_break_with_cells():
    target, depth = _after(_cellular, lambda i: i.opname == "STORE_DEREF")
    assert depth == 0
    rc = bc.make_resume_code(_cellular.__code__, target, [], ["peek"], "__resume_at_x_2")

    def transform(insts, options):
        k = next(i for i, inst in enumerate(insts) if inst.offset == target.offset)
        insts[k:] = (builders.make_function(rc, rc.co_freevars) + builders.load_fast("peek")
                     + builders.call_function(1, push_null_before=True)
                     + builders.return_value())

    new = types.FunctionType(bc.transform_code(_cellular.__code__, transform), globals())
    assert new(4) == _cellular(4)


def f_raise_later(x):
    y = x + 1
    z = {"k": y}
    return z["missing"]


def test_tracebacks_from_resume_code_name_original_lines():
    target, _ = _find(f_raise_later, lambda i: i.opname == "LOAD_FAST" and i.argval == "z", 0)
    fn = _resume_fn(f_raise_later, target, [], ["z"])
    with pytest.raises(KeyError) as info:
        fn({"k": 1})
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert frame.lineno == f_raise_later.__code__.co_firstlineno + 3
    assert frame.name == fn.__code__.co_name


def test_resume_code_metadata():
    call, _ = _find(f_call, lambda i: i.opname in ("PRECALL", "CALL"))
    code = bc.make_resume_code(f_call.__code__, call, _call_layout("s1", "s2", "s3"), ["x"],
                               "__resume_at_7_3", qualname="f_call.<resume>")
    assert code.co_name == "__resume_at_7_3" and code.co_qualname == "f_call.<resume>"
    assert code.co_varnames[:4] == ("s1", "s2", "s3", "x")
    assert code.co_argcount == 4 and code.co_kwonlyargcount == 0
    assert code.co_firstlineno == f_call.__code__.co_firstlineno
    assert not code.co_flags & 0x0C  # no *args / **kwargs
    text = bc.disassemble(code)
    assert "PUSH_NULL" in text and "JUMP_FORWARD" in text


def _gen():
    yield 1


def test_resume_errors():
    call, _ = _find(f_call, lambda i: i.opname in ("PRECALL", "CALL"))
    with pytest.raises(bc.BytecodeError, match="no instruction at offset"):
        bc.make_resume_code(f_call.__code__, 9999, [], [], "r")
    with pytest.raises(bc.BytecodeError, match="already used"):
        bc.make_resume_code(f_call.__code__, call, [None, "a", "s2", "s3"], [], "r")
    with pytest.raises(bc.BytecodeError, match="duplicate"):
        bc.make_resume_code(f_call.__code__, call, [None, "s1", "s1", "s3"], [], "r")
    with pytest.raises(bc.BytecodeError, match="generator"):
        bc.make_resume_code(_gen.__code__, 0, [], [], "r")
    # wrong stack layout inside a loop: the backward jump reaches the head with another depth
    head, _ = _find(f_for, lambda i: i.opname == "FOR_ITER")
    with pytest.raises(bc.BytecodeError, match="underflow"):
        bc.make_resume_code(f_for.__code__, head, [], ["total"], "r")


def f_unbound(flag):
    if flag:
        late = "set"
    marker = 1
    return late, marker


def test_locals_not_passed_are_unbound_not_garbage():
    target, _ = _find(f_unbound, lambda i: i.opname in ("LOAD_FAST", "LOAD_FAST_CHECK")
                      and i.argval == "late")
    fn = _resume_fn(f_unbound, target, [], ["marker"])
    with pytest.raises(UnboundLocalError):
        fn(1)
    fn2 = _resume_fn(f_unbound, target, [], ["late", "marker"])
    assert fn2("x", 1) == ("x", 1)


def _snapshots_at_line_starts(fn, args):
    """Run fn under a line tracer; at each new line whose first instruction has an empty
    stack, record (offset, deep copy of the locals)."""
    import copy

    code = fn.__code__
    insts = bc.decode(code)
    depth_at = dict(zip((i.offset for i in insts), bc.stack_depths(insts), strict=True))
    snaps = {}

    def local_trace(frame, event, arg):
        if event == "line" and frame.f_lasti not in snaps and depth_at.get(frame.f_lasti) == 0:
            # copy containers (mutated later) and methods bound to them, consistently;
            # keep everything else as is (sentinels, modules)
            values = dict(frame.f_locals)
            memo = {id(v): v for v in values.values()  # keep sentinels shared
                    if not isinstance(v, (list, dict, set)) and not callable(v)}

            def snap(v):
                if isinstance(v, (list, dict, set)):
                    return copy.deepcopy(v, memo)
                owner = getattr(v, "__self__", None)
                if callable(v) and isinstance(owner, (list, dict, set)):
                    return getattr(snap(owner), v.__name__)  # e.g. add = res.append
                return v

            snaps[frame.f_lasti] = {k: snap(v) for k, v in values.items()}
        return local_trace

    def global_trace(frame, event, arg):
        return local_trace if frame.f_code is code else None

    old = sys.gettrace()
    sys.settrace(global_trace)
    try:
        result = fn(*args)
    finally:
        sys.settrace(old)
    return result, snaps


def _line_sample(text, width):
    out = []
    for k, para in enumerate(text.split("\n\n")):
        if not para.strip():
            continue
        lines = para.split()[:width]
        if k % 2:
            lines = [ln.upper() for ln in lines]
        out.append(" | ".join(lines))
    total = 0
    while total < len(out):
        total += 1
    return out, total


@pytest.mark.parametrize("fn,args", [
    ("textwrap.dedent", ("    a\n      b\n    c\n",)),
    ("fnmatch.translate", ("*.py[cod]?x",)),
    ("posixpath.relpath", ("/a/./b/../../c//d/", "/a/x")),  # (normpath is C on 3.13)
    ("colorsys.rgb_to_hls", (0.2, 0.4, 0.6)),
    ("shlex.quote", ("it's a test",)),
    ("html.escape", ("<a href='x'>&</a>",)),
    ("_line_sample", ("one two three four five\n\nsix seven eight nine\n\nten", 9)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_resume_at_every_statement_matches_the_original(fn, args):
    if fn == "_line_sample":
        func = _line_sample
    else:
        mod, _, attr = fn.rpartition(".")
        func = getattr(importlib.import_module(mod), attr)
    code = func.__code__
    assert not code.co_cellvars and not code.co_freevars
    expected, snaps = _snapshots_at_line_starts(func, args)
    assert len(snaps) >= 2
    for offset, local_values in snaps.items():
        names = sorted(local_values)
        rc = bc.make_resume_code(code, offset, [], names, f"__resume_at_{offset}_0")
        resumed = types.FunctionType(rc, func.__globals__)
        assert resumed(*[local_values[n] for n in names]) == expected, offset


@pytest.mark.parametrize("module", ["json.decoder", "textwrap", "shlex"])
def test_resume_code_assembles_at_every_reachable_instruction(module):
    """Structural sweep: any instruction with any stack depth yields valid resume code
    (exception handlers, loops and EXTENDED_ARG jumps included)."""
    import inspect

    path = importlib.import_module(module).__file__
    with open(path, encoding="utf-8") as f:
        top = compile(f.read(), path, "exec")
    todo, built = [top], 0
    while todo:
        code = todo.pop()
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                            | inspect.CO_ASYNC_GENERATOR):
            continue
        insts = bc.decode(code)
        for inst, depth in zip(insts, bc.stack_depths(insts), strict=True):
            if depth is None:
                continue
            rc = bc.make_resume_code(code, inst, [f"__s{k}" for k in range(depth)],
                                     list(code.co_varnames), "r")
            assert rc.co_argcount == depth + len(code.co_varnames)
            built += 1
    assert built > 100


# -- make_generator_resume_code: a generator paused at a yield, rebuilt ----------------------

def _paused_gen(x, log):
    try:
        for i in range(3):
            got = yield x + i
            log.append(("got", got))
    except ValueError as e:
        log.append(("caught", str(e)))
        yield -1
    finally:
        log.append("finally")


def _rebuilt_after_first_yield(x, log, remaining):
    """A generator of ``_paused_gen`` rebuilt paused at its first yield (i == 0; the range
    iterator with ``remaining`` items left on the stack), started once."""
    yield_inst, depth = _find(_paused_gen, lambda i: i.opname == "YIELD_VALUE")
    stack = [f"s{k}" for k in range(depth - 1)]  # below the yielded value
    code = bc.make_generator_resume_code(_paused_gen.__code__, yield_inst, stack,
                                         ["x", "log", "i"], "_paused_gen",
                                         qualname=_paused_gen.__qualname__)
    fn = types.FunctionType(code, globals(), "_paused_gen")
    g = fn(*([iter(remaining)] * len(stack)), x, log, 0)
    assert next(g) is None  # its own first yield
    return g


def test_generator_resume_sends_into_the_paused_yield():
    log = []
    g = _rebuilt_after_first_yield(10, log, range(1, 3))
    assert g.send("a") == 11
    assert g.send("b") == 12
    with pytest.raises(StopIteration):
        g.send("c")
    assert log == [("got", "a"), ("got", "b"), ("got", "c"), "finally"]
    assert g.__name__ == "_paused_gen" and g.__qualname__ == _paused_gen.__qualname__


def test_generator_resume_throw_reaches_the_original_handler():
    log = []
    g = _rebuilt_after_first_yield(10, log, range(1, 3))
    assert g.throw(ValueError("boom")) == -1
    g.close()
    assert log == [("caught", "boom"), "finally"]


def test_generator_resume_close_runs_finally():
    log = []
    g = _rebuilt_after_first_yield(10, log, range(1, 3))
    g.close()
    assert log == ["finally"]


def test_generator_resume_refuses_a_yield_offset_elsewhere():
    yield_inst, _ = _find(_paused_gen, lambda i: i.opname == "YIELD_VALUE")
    with pytest.raises(bc.BytecodeError):
        bc.make_generator_resume_code(_paused_gen.__code__, yield_inst.offset + 2, [], [],
                                      "g")
