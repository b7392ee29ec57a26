"""Builders of generated code: each returns a list of new instructions for one operation
(``load_global``, ``call_function``, ``return_const``, ``make_function``, ...).

Which form each version needs is asked of :mod:`.versions` (the one module that knows
versions); this module turns the answer into instructions, so ``versions`` need not import
``instructions`` (which imports it).

Call layout of generated code.  Every builder that prepares a call takes and leaves the
3.11/3.12 layout ``[NULL, callable, *args]`` (``push_null()`` then the callable, or
``load_global(name, push_null=True)``) on every version; on 3.13, whose CALL wants
``[callable, NULL, *args]``, ``call_function``/``call_function_kw``/``call_function_ex`` swap
the two slots first (three SWAPs).  So code built from these builders (and every tracker's
``reconstruct``) is written once.  The exception is the method form, whose layout
``load_method`` and ``call_method`` keep native on every version, as do
``load_global_native`` and ``call_native`` (the compiled frame's call of its graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import versions
from .instructions import Instruction
from .instructions import create_instruction as _ci


def split_paired(inst: Instruction) -> list[Instruction]:
    """A 3.13 superinstruction as its two plain instructions (LOAD_FAST_LOAD_FAST (a, b) ->
    LOAD_FAST a; LOAD_FAST b).  The first is ``inst`` itself, changed in place (so jumps to it
    and its exception-table entry stay); the second is new, with the same positions and
    exception-table entry.  Any other instruction comes back alone."""
    pair = versions.PAIRED_LOCAL_OPS.get(inst.opname)
    if pair is None:
        return [inst]
    first_name, second_name = inst.argval
    second = Instruction(pair[1], None, second_name, None, inst.positions, None,
                         inst.exn_tab_entry)
    inst.opname, inst.arg, inst.argval = pair[0], None, first_name
    return [inst, second]


def resume(kind: int = 0) -> list[Instruction]:
    return [_ci("RESUME", arg=kind)]


def nop() -> list[Instruction]:
    return [_ci("NOP")]


def push_null() -> list[Instruction]:
    return [_ci("PUSH_NULL")]


push_null_ = push_null  # for builders whose parameter is called push_null


def load_const(value: Any) -> list[Instruction]:
    return [_ci("LOAD_CONST", argval=value)]


def load_fast(name: str, checked: bool = False) -> list[Instruction]:
    """Push local ``name``.  ``checked``: the local may be unbound here, raise
    UnboundLocalError then (3.12+'s plain LOAD_FAST does not check; 3.11's always does)."""
    return [_ci(versions.CHECKED_LOAD_FAST if checked else "LOAD_FAST", argval=name)]


def store_fast(name: str) -> list[Instruction]:
    return [_ci("STORE_FAST", argval=name)]


def load_deref(name: str) -> list[Instruction]:
    return [_ci("LOAD_DEREF", argval=name)]


def load_closure(name: str) -> list[Instruction]:
    """Push the cell of cell/free variable ``name`` (3.13: a LOAD_FAST of its slot)."""
    return [_ci("LOAD_CLOSURE", argval=name)]


def load_global(name: str, push_null: bool = False) -> list[Instruction]:
    """Push global ``name``; with ``push_null`` a NULL is pushed first (kiln's call layout
    ``[NULL, callable, *args]`` on every version, see the module docstring; on 3.13 that is
    PUSH_NULL then the global, as LOAD_GLOBAL's own NULL bit would push it above)."""
    if push_null and versions.NULL_ABOVE_CALLABLE:
        return push_null_() + [_ci("LOAD_GLOBAL", arg=0, argval=name)]
    return [_ci("LOAD_GLOBAL", arg=1 if push_null else 0, argval=name)]


def load_global_native(name: str) -> list[Instruction]:
    """Push global ``name`` with its NULL where this version's CALL wants it (LOAD_GLOBAL's
    NULL bit: ``[NULL, g]`` before 3.13, ``[g, NULL]`` on 3.13), for ``call_native``: a
    call on the hot path (a compiled frame calling its graph) needs no swaps on 3.13."""
    return [_ci("LOAD_GLOBAL", arg=1, argval=name)]


def load_attr(name: str) -> list[Instruction]:
    """``TOS = TOS.name``."""
    return [_ci("LOAD_ATTR", arg=0, argval=name)]


def load_method(name: str) -> list[Instruction]:
    """``obj -> [method, obj]`` or ``[NULL, attr]`` (3.13: ``[attr, NULL]``); follow with
    ``call_method(nargs)``."""
    if versions.PY311:
        return [_ci("LOAD_METHOD", argval=name)]
    return [_ci("LOAD_ATTR", arg=1, argval=name)]


def store_attr(name: str) -> list[Instruction]:
    return [_ci("STORE_ATTR", argval=name)]


def rot_n(n: int) -> list[Instruction]:
    """Move TOS down to position ``n`` (1 = top); ``[a, b, c, X] -> [X, a, b, c]`` for n=4."""
    if n <= 1:
        return []
    return [_ci("SWAP", arg=i) for i in range(n, 1, -1)]


def swap(n: int) -> list[Instruction]:
    """Swap TOS with the n-th item (``SWAP n``)."""
    return [_ci("SWAP", arg=n)]


def copy(n: int = 1) -> list[Instruction]:
    """Push a copy of the n-th item (``COPY 1`` duplicates TOS)."""
    return [_ci("COPY", arg=n)]


def dup_top() -> list[Instruction]:
    return copy(1)


def pop_top() -> list[Instruction]:
    return [_ci("POP_TOP")]


def _null_to_native(depth: int) -> list[Instruction]:
    """Turn kiln's call layout ``[NULL, callable, *depth-1 items]`` into this version's:
    nothing before 3.13; on 3.13 the NULL and the callable trade places (``[callable, NULL,
    ...]``): the transposition of stack positions ``depth`` and ``depth + 1`` written as
    three swaps with the top."""
    if not versions.NULL_ABOVE_CALLABLE:
        return []
    if depth == 1:
        return swap(2)
    return swap(depth) + swap(depth + 1) + swap(depth)


def call_function(nargs: int, push_null_before: bool = False) -> list[Instruction]:
    """Call a callable with ``nargs`` positional arguments.

    Expected stack: ``[NULL, callable, *args]`` (e.g. after ``load_global(name, True)``
    or ``push_null()`` and the callable) when ``push_null_before`` is False;
    ``[callable, *args]`` when it is True (the NULL is then pushed and rotated into place).
    Leaves the result.  3.11: ``PRECALL n; CALL n``; 3.12: ``CALL n``; 3.13: the NULL moved
    above the callable, ``CALL n``.
    """
    insts: list[Instruction] = []
    if push_null_before:
        insts += push_null() + rot_n(nargs + (1 if versions.NULL_ABOVE_CALLABLE else 2))
    else:
        insts += _null_to_native(nargs + 1)
    if versions.PY311:
        insts.append(_ci("PRECALL", arg=nargs))
    insts.append(_ci("CALL", arg=nargs))
    return insts


def call_native(nargs: int) -> list[Instruction]:
    """Call with the stack in this version's own layout, ``nargs`` arguments pushed after
    ``load_method(name)`` or ``load_global_native(name)``."""
    if versions.PY311:
        return [_ci("PRECALL", arg=nargs), _ci("CALL", arg=nargs)]
    return [_ci("CALL", arg=nargs)]


call_method = call_native  # the method form's layout is native on every version


def call_function_kw(nargs: int, kw_names: Sequence[str],
                     push_null_before: bool = False) -> list[Instruction]:
    """Call with ``nargs`` arguments in total, the last ``len(kw_names)`` passed by keyword.

    Stack as for :func:`call_function`.  Emits ``KW_NAMES`` right before the call
    (3.11: before ``PRECALL``); 3.13: the names as a constant, then ``CALL_KW``.
    """
    kw_names = tuple(kw_names)
    insts: list[Instruction] = []
    if push_null_before:
        insts += push_null() + rot_n(nargs + (1 if versions.NULL_ABOVE_CALLABLE else 2))
    else:
        insts += _null_to_native(nargs + 1)
    if versions.PY313:
        return insts + [_ci("LOAD_CONST", argval=kw_names), _ci("CALL_KW", arg=nargs)]
    insts.append(_ci("KW_NAMES", argval=kw_names))
    if versions.PY311:
        insts.append(_ci("PRECALL", arg=nargs))
    insts.append(_ci("CALL", arg=nargs))
    return insts


def call_function_ex(has_kwargs: bool) -> list[Instruction]:
    """``CALL_FUNCTION_EX``: stack ``[NULL, callable, args_tuple, (kwargs_dict)]`` (kiln's
    call layout; 3.13's NULL is moved above the callable first)."""
    return _null_to_native(3 if has_kwargs else 2) + [
        _ci("CALL_FUNCTION_EX", arg=1 if has_kwargs else 0)]


def to_bool() -> list[Instruction]:
    """3.13: ``TOS = bool(TOS)`` (what its POP_JUMP_IF_TRUE/FALSE need); nothing before."""
    return [_ci("TO_BOOL")] if versions.PY313 else []


def return_value() -> list[Instruction]:
    return [_ci("RETURN_VALUE")]


def return_const(value: Any) -> list[Instruction]:
    """3.11: ``LOAD_CONST v; RETURN_VALUE``; 3.12+: ``RETURN_CONST v``."""
    if versions.PY312:
        return [_ci("RETURN_CONST", argval=value)]
    return [_ci("LOAD_CONST", argval=value), _ci("RETURN_VALUE")]


def unpack_sequence(n: int) -> list[Instruction]:
    return [_ci("UNPACK_SEQUENCE", arg=n)]


def build_tuple(n: int) -> list[Instruction]:
    return [_ci("BUILD_TUPLE", arg=n)]


def build_list(n: int) -> list[Instruction]:
    return [_ci("BUILD_LIST", arg=n)]


def build_map(n: int) -> list[Instruction]:
    return [_ci("BUILD_MAP", arg=n)]


def binary_op(op: str) -> list[Instruction]:
    """``BINARY_OP`` for ``op`` ("+", "@", "+=", ...)."""
    return [_ci("BINARY_OP", arg=versions.encode_binary_op(op))]


def compare_op(op: str, to_bool: bool = False) -> list[Instruction]:
    """``COMPARE_OP``; ``to_bool``: the result converted to bool (3.13's flag bit; a bool
    already before 3.13 for the comparisons of builtin types, anything for others)."""
    return [_ci("COMPARE_OP", arg=versions.encode_compare(op, to_bool), argval=op)]


def binary_subscr() -> list[Instruction]:
    return [_ci("BINARY_SUBSCR")]


def jump(target: Instruction) -> list[Instruction]:
    """Unconditional jump; the assembler picks JUMP_FORWARD/JUMP_BACKWARD by position."""
    return [_ci("JUMP_FORWARD", target=target)]


def pop_jump_if(condition: str, target: Instruction) -> list[Instruction]:
    """Pop TOS and jump when it is ``"true"``, ``"false"``, ``"none"`` or ``"not_none"``
    (any object: on 3.13 a TO_BOOL comes first for true/false)."""
    generic = {
        "true": "POP_JUMP_IF_TRUE",
        "false": "POP_JUMP_IF_FALSE",
        "none": "POP_JUMP_IF_NONE",
        "not_none": "POP_JUMP_IF_NOT_NONE",
    }[condition]
    prefix = to_bool() if condition in ("true", "false") else []
    return prefix + [_ci(generic, target=target)]


def make_function(code: Any, closure_vars: Sequence[str] = ()) -> list[Instruction]:
    """Build a function from code object ``code`` (qualname from ``code.co_qualname``).

    ``closure_vars``: names of cell/free variables *of the code being assembled* whose cells
    form the closure, in ``code.co_freevars`` order (``LOAD_CLOSURE`` pushes the cell
    itself).  Leaves the function on the stack.
    """
    insts: list[Instruction] = []
    flags = 0
    if closure_vars:
        insts += [_ci("LOAD_CLOSURE", argval=name) for name in closure_vars]
        insts += build_tuple(len(closure_vars))
        flags |= versions.MAKE_FUNCTION_CLOSURE
    insts.append(_ci("LOAD_CONST", argval=code))
    if versions.PY313:
        # 3.13: MAKE_FUNCTION takes only the code; each attribute is set after it
        insts.append(_ci("MAKE_FUNCTION"))
        if flags:
            insts.append(_ci("SET_FUNCTION_ATTRIBUTE", arg=flags))
        return insts
    insts.append(_ci("MAKE_FUNCTION", arg=flags))
    return insts


def copy_free_vars(n: int) -> list[Instruction]:
    return [_ci("COPY_FREE_VARS", arg=n)] if n else []


def make_cells(cellvars: Sequence[str]) -> list[Instruction]:
    return [_ci("MAKE_CELL", argval=name) for name in cellvars]


def prologue(cellvars: Sequence[str], freevars: Sequence[str]) -> list[Instruction]:
    """The start every 3.11+ function needs: ``COPY_FREE_VARS``, ``MAKE_CELL`` per cell
    variable, then ``RESUME 0`` (the compiler's order)."""
    return copy_free_vars(len(freevars)) + make_cells(cellvars) + resume(0)
