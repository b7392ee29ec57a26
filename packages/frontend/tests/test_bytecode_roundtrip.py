"""decode -> assemble round trips over real code: the stdlib and generated stress cases.

Pure Python (no torch); runs on CPython 3.11, 3.12 and 3.13.
"""

from __future__ import annotations

import importlib
import importlib.util
import types

import pytest
from _bytecode_support import bc

versions = bc.versions

STDLIB_MODULES = [
    "json.decoder", "json.encoder", "dataclasses", "typing", "collections", "functools",
    "asyncio.base_events", "asyncio.tasks", "asyncio.streams", "inspect", "ast", "argparse",
    "re._parser", "re._compiler", "enum", "contextlib", "traceback", "unittest.case",
    "logging", "_pydecimal", "pathlib._local" if versions.PY313 else "pathlib", "tokenize", "difflib", "statistics", "textwrap",
    "pprint", "shutil", "threading", "subprocess", "zipfile", "tarfile",
    "fractions", "random", "copy", "calendar", "os", "importlib._bootstrap_external", "configparser",
    "email._header_value_parser", "pickle", "pydoc", "doctest", "dis", "urllib.parse",
    "ipaddress", "concurrent.futures.process", "glob", "graphlib", "mailbox", "string",
]

CHECKED_FIELDS = (
    "co_code", "co_exceptiontable", "co_linetable", "co_stacksize", "co_consts",
    "co_names", "co_varnames", "co_cellvars", "co_freevars", "co_nlocals",
)


def _walk(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk(const)


def _module_code(name: str) -> types.CodeType:
    path = getattr(importlib.import_module(name), "__file__", None)
    if not path or not path.endswith(".py"):
        pytest.skip(f"{name} has no Python source here")
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), path, "exec")


def _assert_same(new: types.CodeType, old: types.CodeType) -> None:
    for field in CHECKED_FIELDS:
        assert getattr(new, field) == getattr(old, field), (old.co_qualname, field)
    assert list(new.co_positions()) == list(old.co_positions()), old.co_qualname
    assert new == old


def _strip_args(insts):
    """Forget every argument the assembler must recompute (keep only flag bits)."""
    for inst in insts:
        name = inst.opname
        if name in versions.JUMPS:
            inst.arg = None
        elif name in versions.HAS_COMPARE:
            inst.arg &= versions.COMPARE_TO_BOOL  # 3.13's bool bit is a flag
        elif name in versions.HAS_NAME:
            inst.arg &= (1 << versions.name_arg_shift(name)) - 1
        elif name in versions.HAS_LOCAL or name in versions.HAS_FREE:
            inst.arg = None
    return insts


@pytest.mark.parametrize("module", STDLIB_MODULES)
def test_stdlib_round_trip_is_byte_identical(module):
    count = 0
    for code in _walk(_module_code(module)):
        _assert_same(bc.assemble(bc.decode(code), code), code)
        count += 1
    assert count > 1


@pytest.mark.parametrize("module", ["json.decoder", "argparse", "asyncio.base_events", "inspect"])
def test_round_trip_recomputes_arguments_from_argval(module):
    for code in _walk(_module_code(module)):
        insts = _strip_args(bc.decode(code))
        _assert_same(bc.assemble(insts, code), code)


def test_round_trip_of_live_functions_and_methods():
    import collections
    import dataclasses
    import functools
    import json

    seen = 0
    for mod in (json, collections, functools, dataclasses):
        for obj in vars(mod).values():
            fns = [obj]
            if isinstance(obj, type):
                fns = list(vars(obj).values())
            for fn in fns:
                code = getattr(fn, "__code__", None)
                if isinstance(code, types.CodeType):
                    _assert_same(bc.assemble(bc.decode(code), code), code)
                    seen += 1
    assert seen > 50


def test_decode_matches_dis():
    import dis

    code = _module_code("argparse")
    for c in _walk(code):
        ours = bc.decode(c)
        every = list(dis.get_instructions(c))
        theirs = [i for i in every if i.opname != "EXTENDED_ARG"]
        owner = {}  # offset of an EXTENDED_ARG prefix -> offset of its instruction
        for i in reversed(every):
            owner[i.offset] = owner.get(i.offset + 2, i.offset) if i.opname == "EXTENDED_ARG" else i.offset
        assert [(i.opname, i.offset) for i in ours] == [(i.opname, i.offset) for i in theirs]
        for a, b in zip(ours, theirs, strict=True):
            if a.opname in versions.JUMPS:
                assert a.target.offset == owner[b.argval]
            elif (a.opname in versions.HAS_NAME or a.opname in versions.HAS_LOCAL
                  or a.opname in versions.HAS_FREE or a.opname in versions.HAS_COMPARE):
                assert a.argval == b.argval, (a, b)
            elif a.opname in versions.HAS_CONST:
                assert a.argval is c.co_consts[b.arg], (a, b)
            assert a.arg == b.arg
            assert tuple(a.positions or (None,) * 4) == tuple(b.positions)


def _big_function_source(n_consts: int, n_body: int) -> str:
    lines = ["def big(flag):", "    total = 0"]
    lines += [f"    v{k} = {k}.5" for k in range(n_consts)]
    lines += ["    for i in range(3):"]
    lines += [f"        total += v{k % n_consts} * i" for k in range(n_body)]
    lines += ["        if flag:", "            continue", "        total -= 1"]
    lines += ["    try:", "        total += undefined_name", "    except NameError:",
              "        total += 1000"]
    lines += ["    return total"]
    return "\n".join(lines)


def test_extended_args_round_trip_and_run():
    src = _big_function_source(300, 700)  # >256 locals/consts, jumps longer than 255 units
    ns: dict = {}
    exec(compile(src, "<big>", "exec"), ns)
    big = ns["big"]
    code = big.__code__
    assert versions.EXTENDED_ARG in code.co_code[::2]
    insts = bc.decode(code)
    assert all(i.opname != "EXTENDED_ARG" for i in insts)
    new = bc.assemble(insts, code)
    _assert_same(new, code)
    insts = _strip_args(bc.decode(code))
    _assert_same(bc.assemble(insts, code), code)
    # and a version that needs more prefixes than the original
    insts = bc.decode(code)
    loop_head = next(i for i in insts if i.opname == "FOR_ITER")
    at = insts.index(loop_head) + 1
    insts[at:at] = [bc.create_instruction("NOP") for _ in range(70000)]
    grown = bc.assemble(insts, code)
    assert len(grown.co_code) > len(code.co_code)
    f2 = types.FunctionType(grown, ns)
    assert f2(True) == big(True)
    assert f2(False) == big(False)


def test_decode_resolves_targets_into_extended_arg_prefixed_instructions():
    src = "\n".join(
        ["def f(n):", "    out = []", "    while n:"]
        + [f"        x{k} = {k}" for k in range(300)]
        + ["        n -= 1", "        out.append(x299)", "    return out"]
    )
    ns: dict = {}
    exec(compile(src, "<w>", "exec"), ns)
    code = ns["f"].__code__
    insts = bc.decode(code)
    for inst in insts:
        if inst.target is not None:
            assert inst.target in insts
    _assert_same(bc.assemble(insts, code), code)
    assert types.FunctionType(bc.assemble(insts, code), ns)(3) == [299, 299, 299]
