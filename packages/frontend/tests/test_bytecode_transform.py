"""Edited bytecode still runs: inserted instructions, builders, jump rewriting, line numbers,
stack depths, tables, disassembly.  Pure Python (no torch); CPython 3.11 and 3.12."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import traceback
import types

import pytest
from _bytecode_support import bc

versions = bc.versions
builders = bc.builders
tables = importlib.import_module("kiln_frontend.bytecode.tables")

# --------------------------------------------------------------------------------------
# Sample functions covering the compiler's shapes
# --------------------------------------------------------------------------------------

COUNTER = {"n": 0}


def _count():
    COUNTER["n"] += 1


def s_try(x):
    try:
        r = 10 // x
    except ZeroDivisionError as e:
        r = str(e)
    finally:
        x = -1
    return r, x


class CM:
    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", exc[0]))
        return exc[0] is KeyError


def s_with(fail):
    cm = CM()
    with cm as c:
        c.log.append("body")
        if fail:
            raise KeyError("k")
    return cm.log


def s_loops(n):
    out = []
    i = 0
    while i < n:
        for j in range(i):
            if j % 2:
                continue
            if j > 6:
                break
            out.append(i * j)
        else:
            out.append(-i)
        i += 1
    return out


def s_closure(a):
    b = a * 2

    def inner(c):
        nonlocal b
        b += c
        return a + b + c

    return inner(1), inner(2), b


def s_generator(n):
    def gen():
        for i in range(n):
            got = yield i
            if got:
                yield from range(got)

    g = gen()
    out = [next(g), g.send(2), next(g), next(g)]
    out += list(g)
    return out


def s_comprehensions(xs):
    sq = [x * x for x in xs if x % 2]
    st = {x % 3 for x in xs}
    dc = {x: [y for y in range(x)] for x in xs[:3]}
    ge = sum(x for x in xs)
    return sq, st, dc, ge


def _kw(a, b=2, *args, c=3, **kw):
    return (a, b, args, c, sorted(kw.items()))


def s_calls(x):
    return (_kw(x), _kw(x, c=4), _kw(x, 1, 2, 3, c=5, d=6), _kw(*[x, 9], **{"z": 1}),
            "abc".upper(), max([3, x, 1], key=lambda v: -v))


def s_fstrings(x, y):
    return f"{x}-{y!r}-{x:>5}-{y!s:^7}-{x + 1:{y}}"


def s_match(v):
    match v:
        case [a, b]:
            return a + b
        case {"k": k}:
            return k
        case str() as s if s:
            return s
        case _:
            return None


def s_except_star():
    caught = []
    try:
        raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
    except* ValueError as e:
        caught.append(type(e.exceptions[0]).__name__)
    except* TypeError as e:
        caught.append(type(e.exceptions[0]).__name__)
    return caught


def s_async_driver(n):
    async def agen():
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    async def main():
        out = [i async for i in agen()]
        async with _ACM() as v:
            out.append(v)
        return out

    return asyncio.run(main())


class _ACM:
    async def __aenter__(self):
        return "acm"

    async def __aexit__(self, *exc):
        return False


class _Base:
    def m(self):
        return "base"


class _Derived(_Base):
    def m(self):
        return "derived+" + super().m()


def s_super():
    return _Derived().m()


SAMPLES = [
    (s_try, [(2,), (0,)]),
    (s_with, [(False,), (True,)]),
    (s_loops, [(0,), (5,), (12,)]),
    (s_closure, [(3,)]),
    (s_generator, [(4,)]),
    (s_comprehensions, [([1, 2, 3, 4, 5],)]),
    (s_calls, [(7,)]),
    (s_fstrings, [(3, "ab"), (12, 4)]),
    (s_match, [([1, 2],), ({"k": 5},), ("s",), (3,)]),
    (s_except_star, [()]),
    (s_async_driver, [(3,)]),
    (s_super, [()]),
]


def _all_codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _all_codes(c)


def _replace_code_deep(code, edit):
    """Apply ``edit(code) -> code`` to ``code`` and, bottom-up, to its nested code."""
    consts = tuple(
        _replace_code_deep(c, edit) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
    )
    return edit(code.replace(co_consts=consts))


def _with_code(fn, code):
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _insert_after_resume(code, make):
    def transform(insts, options):
        k = next(i for i, inst in enumerate(insts) if inst.opname == "RESUME") + 1
        insts[k:k] = make()

    return bc.transform_code(code, transform)


def _counter_call():
    return (builders.load_global("_count", push_null=True) + builders.call_function(0)
            + builders.pop_top())


def _run(fn, args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001
        return ("raised", type(e), str(e))


@pytest.mark.parametrize("fn,arg_sets", SAMPLES, ids=[f.__name__ for f, _ in SAMPLES])
@pytest.mark.parametrize("edit", ["nop", "counter", "nops_everywhere", "args_stripped"])
def test_edited_code_runs_identically(fn, arg_sets, edit):
    def edit_code(code):
        if edit == "nop":
            return _insert_after_resume(code, builders.nop)
        if edit == "counter":
            return _insert_after_resume(code, _counter_call)
        if edit == "nops_everywhere":
            def transform(insts, options):
                out = []
                for k, inst in enumerate(insts):
                    out.append(inst)
                    if inst.opname in ("KW_NAMES", "RETURN_GENERATOR", "PRECALL"):
                        continue
                    if inst.opname in versions.FOR_ITER_SKIPS[:-1] and \
                            insts[k + 1].opname in versions.FOR_ITER_SKIPS[1:]:
                        continue  # 3.13: an exhausted FOR_ITER skips END_FOR and POP_TOP
                    out.append(bc.create_instruction("NOP"))
                insts[:] = out
            return bc.transform_code(code, transform)

        def strip(insts, options):  # recompute every argument from argval / target
            for inst in insts:
                if inst.opname not in versions.HAS_NAME:
                    if (inst.opname in versions.JUMPS or inst.opname in versions.HAS_CONST
                            or inst.opname in versions.HAS_LOCAL
                            or inst.opname in versions.HAS_FREE):
                        inst.arg = None
        return bc.transform_code(code, strip)

    new_fn = _with_code(fn, _replace_code_deep(fn.__code__, edit_code))
    for args in arg_sets:
        COUNTER["n"] = 0
        expected = _run(fn, args)
        calls_before = COUNTER["n"]
        got = _run(new_fn, args)
        assert got == expected
        if edit == "counter":
            assert COUNTER["n"] > calls_before


def _raiser(d):
    x = 1
    y = d["missing"]  # line RAISE_LINE
    return x + y


RAISE_LINE = _raiser.__code__.co_firstlineno + 2


def _frame_summary(fn, *args):
    try:
        fn(*args)
    except KeyError as e:
        return traceback.extract_tb(e.__traceback__)[-1]
    raise AssertionError("did not raise")


def test_tracebacks_keep_lines_and_columns_after_insertion():
    original = _frame_summary(_raiser, {})
    assert original.lineno == RAISE_LINE
    code = _insert_after_resume(_raiser.__code__, lambda: builders.nop() + builders.nop() + _counter_call())

    def transform(insts, options):  # also insert right before the failing subscript
        k = next(i for i, inst in enumerate(insts) if inst.opname == "BINARY_SUBSCR")
        insts[k:k] = builders.nop()

    code = bc.transform_code(code, transform)
    got = _frame_summary(_with_code(_raiser, code), {})
    assert (got.lineno, got.end_lineno, got.colno, got.end_colno) == (
        original.lineno, original.end_lineno, original.colno, original.end_colno)
    assert got.line == original.line


def test_new_instructions_inherit_the_previous_line():
    code = _raiser.__code__
    insts = bc.decode(code)
    k = next(i for i, inst in enumerate(insts) if inst.opname == "BINARY_SUBSCR")
    # make the inserted code itself raise: call a global that does not exist
    insts[k:k] = (builders.load_global("_no_such_global_", push_null=True)
                  + builders.call_function(0) + builders.pop_top())
    new = _with_code(_raiser, bc.assemble(insts, code))
    with pytest.raises(NameError) as info:
        new({})
    assert traceback.extract_tb(info.value.__traceback__)[-1].lineno == RAISE_LINE


def test_function_built_from_builders():
    def template(a, b):
        pass

    insts = (
        builders.resume()
        + builders.load_global("_kw", push_null=True)
        + builders.load_fast("a")
        + builders.load_fast("b")
        + builders.load_const(7)
        + builders.call_function_kw(3, ("c",))
        + builders.store_fast("res")
        + builders.load_global("sorted")  # no NULL: inserted by call_function below
        + builders.load_fast("res")
        + builders.load_const(4)
        + builders.binary_subscr()
        + builders.call_function(1, push_null_before=True)
        + builders.load_fast("res")
        + builders.build_tuple(2)
        + builders.unpack_sequence(2)
        + builders.swap(2)
        + builders.build_tuple(2)
        + builders.return_value()
    )
    code = bc.assemble(insts, template.__code__)
    assert "res" in code.co_varnames
    fn = types.FunctionType(code, globals())
    res = _kw(1, 2, c=7)
    assert fn(1, 2) == (sorted(res[4]), res)


def _collect(*args, **kwargs):
    return args, sorted(kwargs.items())


@pytest.mark.parametrize("nargs", [0, 1, 3])
def test_call_builders_take_one_call_layout_on_every_version(nargs):
    """Generated code pushes ``[NULL, callable, *args]`` on every version (push_null first);
    the call builders put 3.13's NULL above the callable themselves."""
    def template(a):
        pass

    args = list(range(nargs))

    def call(build_call, *pushes):
        insts = builders.resume() + builders.push_null() + builders.load_global("_collect")
        for p in pushes:
            insts += p
        insts += build_call + builders.return_value()
        return types.FunctionType(bc.assemble(insts, template.__code__), globals())(0)

    loads = [builders.load_const(v) for v in args]
    assert call(builders.call_function(nargs), *loads) == _collect(*args)
    kw = call(builders.call_function_kw(nargs + 1, ("c",)), *loads, builders.load_const(9))
    assert kw == _collect(*args, c=9)
    as_tuple = builders.load_const(tuple(args))
    assert call(builders.call_function_ex(False), as_tuple) == _collect(*args)
    kwargs = builders.load_const("c") + builders.load_const(5) + builders.build_map(1)
    assert call(builders.call_function_ex(True), as_tuple, kwargs) == _collect(*args, c=5)


@pytest.mark.parametrize("nargs", [0, 1, 3])
def test_native_global_call_needs_no_swaps(nargs):
    """``load_global_native`` + ``call_native``: the global with its NULL where this
    version's CALL wants it (the compiled frame's call of its graph), no SWAP on 3.13."""
    def template(a):
        pass

    insts = builders.resume() + builders.load_global_native("_collect")
    for v in range(nargs):
        insts += builders.load_const(v)
    insts += builders.call_native(nargs) + builders.return_value()
    assert not any(i.opname == "SWAP" for i in insts)
    fn = types.FunctionType(bc.assemble(insts, template.__code__), globals())
    assert fn(0) == _collect(*range(nargs))


def test_builders_method_calls_attributes_and_return_const():
    def template(s):
        pass

    insts = (
        builders.resume()
        + builders.load_fast("s")
        + builders.load_method("replace")
        + builders.load_const("a")
        + builders.load_const("b")
        + builders.call_method(2)
        + builders.store_fast("t")
        + builders.load_fast("t")
        + builders.load_attr("upper")
        + builders.call_function(0, push_null_before=True)
        + builders.load_fast("t")
        + builders.compare_op("==")
        + builders.pop_jump_if("true", None)
        + builders.load_fast("t")
        + builders.return_value()
    )
    tail = builders.return_const("same")
    jump = next(i for i in insts if i.opname in versions.CONDITIONAL_JUMPS)
    jump.target = tail[0]
    code = bc.assemble(insts + tail, template.__code__)
    fn = types.FunctionType(code, globals())
    assert fn("aaa") == "bbb"
    assert fn("B") == "same"


def test_make_function_builder_with_closure():
    def template(x):
        def helper():
            return x

        return helper

    inner = template.__code__.co_consts[1]
    assert isinstance(inner, types.CodeType)
    insts = (
        builders.prologue(template.__code__.co_cellvars, ())
        + builders.make_function(inner, ("x",))
        + builders.call_function(0, push_null_before=True)
        + builders.return_value()
    )
    fn = types.FunctionType(bc.assemble(insts, template.__code__), globals())
    assert fn(41) == 41


@pytest.mark.parametrize("generic", ["POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE",
                                     "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE"])
def test_backward_conditional_jumps(generic):
    # i = n; loop: i -= 1; out.append(i); jump back while condition(i) holds
    def template(n):
        pass

    cond_value = {
        "POP_JUMP_IF_TRUE": lambda i: i,  # jump while i is truthy
        "POP_JUMP_IF_FALSE": lambda i: not i,
        "POP_JUMP_IF_NONE": lambda i: None if i else 0,
        "POP_JUMP_IF_NOT_NONE": lambda i: 0 if i else None,
    }[generic]
    head = bc.create_instruction("LOAD_FAST", argval="i")
    insts = (
        builders.resume()
        + builders.build_list(0) + builders.store_fast("out")
        + builders.load_fast("n") + builders.store_fast("i")
        + [head]
        + builders.load_const(1) + builders.binary_op("-=") + builders.store_fast("i")
        + builders.load_fast("out") + builders.load_method("append")
        + builders.load_fast("i") + builders.call_method(1) + builders.pop_top()
        + builders.load_global("cond", push_null=True) + builders.load_fast("i")
        + builders.call_function(1)
        # 3.13's POP_JUMP_IF_TRUE/FALSE take only bools
        + (builders.to_bool() if generic in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE") else [])
        + [bc.create_instruction(generic, target=head)]
        + builders.load_fast("out") + builders.return_value()
    )
    code = bc.assemble(insts, template.__code__)
    names = [i.opname for i in bc.decode(code)]
    if versions.PY312:
        assert "JUMP_BACKWARD" in names
    else:
        assert any("BACKWARD_IF" in n for n in names)
    fn = types.FunctionType(code, {"cond": cond_value})
    assert fn(4) == [3, 2, 1, 0]


def test_jump_direction_is_fixed_up():
    def f(n):
        total = 0
        while n:
            total += n
            n -= 1
        return total

    def transform(insts, options):
        for inst in insts:
            if inst.opname == "JUMP_BACKWARD":
                inst.opname = "JUMP_FORWARD"  # wrong on purpose; assemble picks the direction

    fn = _with_code(f, bc.transform_code(f.__code__, transform))
    assert fn(4) == 10


def test_create_instruction_normalizes():
    j = bc.create_instruction("JUMP", target=bc.create_instruction("NOP"))
    assert j.opname == "JUMP_FORWARD"
    p = bc.create_instruction("POP_JUMP_IF_FALSE", target=j)
    assert p.opname in ("POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE")
    assert bc.create_instruction("BUILD_TUPLE", arg=3).argval == 3
    assert bc.create_instruction("BUILD_TUPLE", argval=3).arg == 3
    assert bc.create_instruction("BINARY_OP", argval="+").arg == 0
    with pytest.raises(ValueError):
        bc.create_instruction("NO_SUCH_OP")
    with pytest.raises(ValueError):
        bc.create_instruction("NOP", target=j)
    r = repr(bc.create_instruction("LOAD_FAST", argval="x"))
    assert r == "Instruction(LOAD_FAST 'x' @new)"


def test_instruction_repr_for_decoded():
    insts = bc.decode(_raiser.__code__)
    load = next(i for i in insts if i.opname == "LOAD_FAST" and i.argval == "d")
    assert repr(load) == f"Instruction(LOAD_FAST 'd' @{load.offset} line {RAISE_LINE})"


def test_stack_depths_and_errors():
    insts = bc.decode(s_try.__code__)
    depths = bc.stack_depths(insts)
    assert depths[0] == 0
    assert max(d for d in depths if d is not None) <= s_try.__code__.co_stacksize

    def template():
        pass

    bad = builders.resume() + builders.pop_top() + builders.return_const(None)
    with pytest.raises(bc.BytecodeError, match="underflow"):
        bc.assemble(bad, template.__code__)
    end = builders.return_value()
    mismatch = (builders.resume() + builders.load_const(1) + builders.load_const(True)
                + builders.pop_jump_if("true", end[0]) + builders.load_const(2) + end)
    with pytest.raises(bc.BytecodeError, match="inconsistent stack depth"):
        bc.assemble(mismatch, template.__code__)
    with pytest.raises(bc.BytecodeError, match="not in the list"):
        bc.assemble(builders.resume() + builders.jump(bc.create_instruction("NOP")),
                    template.__code__)
    with pytest.raises(TypeError):
        bc.assemble(builders.resume() + builders.return_const(None), template.__code__,
                    co_code=b"")


def test_stack_effect_and_classification():
    ret = builders.return_value()[0]
    assert bc.is_return(ret) and bc.is_terminator(ret) and not bc.is_jump(ret)
    j = builders.jump(ret)[0]
    assert bc.is_jump(j) and bc.is_unconditional_jump(j) and not bc.is_conditional_jump(j)
    c = builders.pop_jump_if("false", ret)[-1]  # 3.13: after a TO_BOOL
    assert bc.is_conditional_jump(c) and not bc.is_terminator(c)
    assert bc.stack_effect(c, jump=True) == -1
    assert sum(bc.stack_effect(i) for i in builders.load_global("g", push_null=True)) == 2
    assert bc.stack_effect(builders.load_global("g")[0]) == 1
    assert bc.stack_effect(builders.build_tuple(3)[0]) == -2
    assert sum(bc.stack_effect(i) for i in builders.call_function(2)) == -3
    assert bc.stack_effect(builders.load_method("m")[0]) == 1
    assert bc.is_raise(bc.create_instruction("RERAISE", arg=0))
    assert versions.is_backward_jump("JUMP_BACKWARD")
    assert versions.generic_opname("JUMP_BACKWARD") == "JUMP"
    assert versions.generic_opname(c.opname) == "POP_JUMP_IF_FALSE"
    assert versions.generic_opname("LOAD_FAST") == "LOAD_FAST"


def test_compare_op_encoding_round_trips():
    for op in versions.COMPARE_OPS:
        assert versions.decode_compare(versions.encode_compare(op)) == op

    def cmp(a, b):
        return [a < b, a <= b, a == b, a != b, a > b, a >= b]

    def transform(insts, options):
        for inst in insts:
            if inst.opname == "COMPARE_OP":
                inst.arg = None  # recomputed from argval ("<", ...)

    fn = _with_code(cmp, bc.transform_code(cmp.__code__, transform))
    for a, b in [(1, 2), (2, 2), (3, 2), (1.5, 1.5), ("a", "b")]:
        for _ in range(10):  # let the specializing interpreter kick in
            assert fn(a, b) == cmp(a, b)


def test_new_consts_names_and_locals_are_interned():
    def f():
        return 1

    insts = (builders.resume() + builders.load_const(1.0) + builders.load_const(1)
             + builders.load_const(True) + builders.load_const(-0.0) + builders.load_const(0.0)
             + builders.build_tuple(5) + builders.store_fast("tmp") + builders.load_fast("tmp")
             + builders.return_value())
    code = bc.assemble(insts, f.__code__)
    assert types.FunctionType(code, {})() == (1.0, 1, True, -0.0, 0.0)
    kinds = [(type(c), repr(c)) for c in code.co_consts]
    assert len(kinds) == len(set(kinds))
    assert code.co_varnames == ("tmp",) and code.co_nlocals == 1


def test_exception_table_codec_round_trip():
    entries = [(0, 8, 20, 0, False), (8, 12, 40, 1, True), (200, 100000, 4, 70, True),
               (100000, 2**20, 2**21, 0, False)]
    assert tables.parse_exception_table(tables.encode_exception_table(entries)) == entries


def test_location_table_edge_cases():
    def template():
        pass

    P = bc.Positions
    cases = [
        P(template.__code__.co_firstlineno + 1, template.__code__.co_firstlineno + 1, 4, 9),
        P(3, 3, 100, 140),  # line far before firstlineno: negative delta, wide columns
        P(3000, 3005, 0, 2),  # multi-line
        P(3000, 3000, None, None),  # no columns
        None,  # no location
        P(7, 7, 300, 1000),
        P(8, 8, 79, 94),  # short form boundary
        P(8, 8, 80, 81),
    ]
    insts = builders.resume()
    insts[0].positions = cases[0]
    body = []
    for pos in cases:
        inst = builders.nop()[0]
        inst.positions = pos
        inst.offset = 0  # pretend it is original so None is not filled in
        body.append(inst)
    ret = builders.return_const(None)
    for i in ret:
        i.positions = cases[0]
    code = bc.assemble(insts + body + ret, template.__code__)
    got = list(code.co_positions())
    for k, pos in enumerate(cases):
        want = (None, None, None, None) if pos is None else tuple(pos)
        assert got[1 + k] == want


def test_disassemble_text():
    text = bc.disassemble(s_try.__code__)
    assert "RESUME" in text and "ExceptionTable:" in text and ">>" in text
    assert "ZeroDivisionError" in text
    insts = bc.decode(s_try.__code__)
    insts.insert(1, bc.create_instruction("NOP"))
    text2 = bc.disassemble(insts)
    assert "  new NOP" in text2
    nested = bc.disassemble(s_closure.__code__, recursive=True)
    assert "s_closure.<locals>.inner" in nested


def test_transform_code_can_add_arguments():
    def f(a):
        return a * 2

    def transform(insts, options):
        options["co_varnames"] = ("a", "b") + options["co_varnames"][1:]
        options["co_argcount"] = 2
        k = next(i for i, inst in enumerate(insts) if inst.opname == "RETURN_VALUE")
        insts[k:k] = builders.load_fast("b") + builders.binary_op("+")

    fn = types.FunctionType(bc.transform_code(f.__code__, transform), {})
    assert fn(3, 1) == 7
