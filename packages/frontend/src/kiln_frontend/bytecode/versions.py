"""Everything that differs between CPython 3.11, 3.12 and 3.13 bytecode, in one module.

No other module of ``kiln_frontend.bytecode`` looks at ``sys.version_info`` or at opcode
numbers directly: they ask this module.  It holds

* opcode tables (names, numbers, inline CACHE counts, which opcodes take a const/name/local/
  free-variable/jump/comparison argument),
* the version-specific argument encodings (LOAD_GLOBAL's NULL bit, 3.12+ LOAD_ATTR's method
  bit, LOAD_SUPER_ATTR's two flag bits, COMPARE_OP's 3.12 mask bits and 3.13 bool bit,
  BINARY_OP's operator index, 3.13's two local slots in one argument) in both directions,
* jump direction rules (3.11 has FORWARD/BACKWARD variants of every conditional jump, 3.12
  has only forward conditional jumps),
* opcode classification (``is_jump``, ``is_conditional_jump``, ``is_return``, ...),
* ``stack_effect(inst, jump=...)``,
* builders that return instruction lists for common operations (``load_global``,
  ``call_function``, ``return_const``, ``make_function``, ...).

Call layout of generated code.  Every builder that prepares a call takes and leaves the
3.11/3.12 layout ``[NULL, callable, *args]`` (``push_null()`` then the callable, or
``load_global(name, push_null=True)``) on every version; on 3.13, whose CALL wants
``[callable, NULL, *args]``, ``call_function``/``call_function_kw``/``call_function_ex`` swap
the two slots first (three SWAPs).  So code built from these builders (and every tracker's
``reconstruct``) is written once.  The exception is the method form, whose layout
``load_method`` and ``call_method`` keep native on every version.
"""

from __future__ import annotations

import dis
import opcode as _opcode
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .instructions import Instruction

#: the CPython versions kiln's bytecode layer (and the opcode handlers) know
SUPPORTED_VERSIONS: tuple[tuple[int, int], ...] = ((3, 11), (3, 12), (3, 13))

PY_VERSION = sys.version_info[:2]
if PY_VERSION not in SUPPORTED_VERSIONS:
    raise ImportError(
        "kiln_frontend.bytecode supports CPython 3.11 to 3.13, not "
        f"{sys.version.split()[0]}"
    )

PY311 = PY_VERSION == (3, 11)
#: 3.12 or later: what 3.12 changed and 3.13 kept (RETURN_CONST, LOAD_ATTR's method bit,
#: forward-only conditional jumps, COMPARE_OP's outcome mask, END_FOR, ...)
PY312 = PY_VERSION >= (3, 12)
#: 3.13 or later: CALL's ``[callable, self_or_null]`` order, CALL_KW, TO_BOOL, superinstructions
#: over two locals, MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE, CONVERT_VALUE/FORMAT_*, ...
PY313 = PY_VERSION >= (3, 13)

# --------------------------------------------------------------------------------------
# Opcode tables
# --------------------------------------------------------------------------------------

#: opname -> opcode, real opcodes only (no 3.12 pseudo-instructions, which are >= 256).
OPMAP: dict[str, int] = {name: op for name, op in dis.opmap.items() if op < 256}
#: opcode -> opname
OPNAMES: dict[int, str] = {op: name for name, op in OPMAP.items()}

HAVE_ARGUMENT: int = _opcode.HAVE_ARGUMENT
EXTENDED_ARG: int = OPMAP["EXTENDED_ARG"]
CACHE: int = OPMAP["CACHE"]


def _names(ops: Iterable[int]) -> frozenset[str]:
    return frozenset(OPNAMES[o] for o in ops if o in OPNAMES)


#: opname -> number of inline CACHE code units that follow the instruction (a list by
#: opcode on 3.11/3.12, a dict by opname on 3.13).
if isinstance(_opcode._inline_cache_entries, dict):
    CACHE_ENTRIES: dict[str, int] = {
        name: n for name, n in _opcode._inline_cache_entries.items() if n and name in OPMAP
    }
else:
    CACHE_ENTRIES = {
        OPNAMES[op]: n for op, n in enumerate(_opcode._inline_cache_entries)
        if n and op in OPNAMES
    }

HAS_CONST = _names(dis.hasconst)  # LOAD_CONST, KW_NAMES, (3.12) RETURN_CONST
HAS_NAME = _names(dis.hasname)  # index into co_names (maybe shifted, see NAME_ARG_SHIFT)
HAS_LOCAL = _names(dis.haslocal)  # index into "localsplus" (see localsplus_names)
#: 3.13 superinstructions over two local slots (``arg = first << 4 | second``): their
#: ``argval`` is the pair of names; each slot must be below 16 (the assembler splits the
#: instruction in two otherwise)
PAIRED_LOCAL_OPS: dict[str, tuple[str, str]] = {
    name: pair for name, pair in {
        "LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
        "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
        "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
    }.items() if name in OPMAP
}
HAS_FREE = _names(dis.hasfree)  # index into "localsplus" too (3.11+)
HAS_COMPARE = _names(dis.hascompare)  # COMPARE_OP
JUMPS = _names(dis.hasjrel) | _names(dis.hasjabs)  # all relative on 3.11/3.12
#: opcodes whose argument the assembler derives from ``argval``/``target`` (all others
#: take ``arg`` as a plain integer)
RESOLVED_ARG_OPS = HAS_CONST | HAS_NAME | HAS_LOCAL | HAS_FREE | HAS_COMPARE | JUMPS

#: LOAD_GLOBAL / LOAD_ATTR / LOAD_SUPER_ATTR keep flag bits under the name index.
NAME_ARG_SHIFT: dict[str, int] = {"LOAD_GLOBAL": 1}
if PY312:
    NAME_ARG_SHIFT["LOAD_ATTR"] = 1  # low bit: "load method" (replaces 3.11's LOAD_METHOD)
    NAME_ARG_SHIFT["LOAD_SUPER_ATTR"] = 2  # bit 0: load method, bit 1: two-argument super()

#: 3.13: the NULL of a call (LOAD_GLOBAL's bit 0, LOAD_ATTR's and LOAD_SUPER_ATTR's method
#: bit, PUSH_NULL) sits above the callable; 3.11/3.12 put it below.
NULL_ABOVE_CALLABLE = PY313

#: Pseudo-instructions of the compiler that are no real opcode on this version, and the
#: real opcode that does their work (3.13 loads a cell for a closure with LOAD_FAST).
PSEUDO_OPNAMES: dict[str, str] = {"LOAD_CLOSURE": "LOAD_FAST"} if PY313 else {}

BACKWARD_JUMPS = frozenset(n for n in JUMPS if "BACKWARD" in n)
UNCONDITIONAL_JUMPS = frozenset(
    n for n in ("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT") if n in OPMAP
)
CONDITIONAL_JUMPS = JUMPS - UNCONDITIONAL_JUMPS  # POP_JUMP_*, JUMP_IF_*_OR_POP, FOR_ITER, SEND

#: what an exhausted FOR_ITER skips after jumping to its target (3.12: the END_FOR there;
#: 3.13: END_FOR and the POP_TOP after it), so these must follow the target in this order
FOR_ITER_SKIPS: tuple[str, ...] = (
    ("END_FOR", "POP_TOP") if PY313 else ("END_FOR",) if PY312 else ())

RETURNS = frozenset(n for n in ("RETURN_VALUE", "RETURN_CONST") if n in OPMAP)
RAISES = frozenset({"RAISE_VARARGS", "RERAISE"})
#: instructions after which control never falls through to the next instruction
TERMINATORS = UNCONDITIONAL_JUMPS | RETURNS | RAISES

#: LOAD_FAST that raises UnboundLocalError on an unbound local instead of assuming it is
#: bound (3.12's LOAD_FAST trusts the compiler's analysis; 3.11's checks every time).
CHECKED_LOAD_FAST = "LOAD_FAST_CHECK" if PY312 else "LOAD_FAST"

#: The 3.12+ compiler writes one location entry per run of instructions with equal
#: positions; 3.11 writes one (or more) per instruction.
LINETABLE_MERGES_RUNS = PY312

#: binary operator symbols in BINARY_OP's argument order ("+", "&", ..., "+=", ...).
BINARY_OPS: tuple[str, ...] = tuple(sym for _name, sym in dis._nb_ops)
COMPARE_OPS: tuple[str, ...] = tuple(dis.cmp_op)

# 3.12 COMPARE_OP keeps, under the operator index (arg >> 4), a mask of the outcomes that make
# the comparison true; the specialized int/float/str comparisons read it.  3.13 moves the
# index up one bit (arg >> 5): bit 4 asks for the result converted to bool (what a following
# POP_JUMP_IF_* needs, since 3.13's conditional jumps take only bools).
_COMPARE_SHIFT = 5 if PY313 else 4 if PY312 else 0
#: 3.13 COMPARE_OP flag: convert the result with bool()
COMPARE_TO_BOOL = 16 if PY313 else 0
_UNORDERED, _LESS, _GREATER, _EQUAL = 1, 2, 4, 8
_COMPARE_MASKS = {
    "<": _LESS,
    "<=": _LESS | _EQUAL,
    "==": _EQUAL,
    "!=": _UNORDERED | _LESS | _GREATER,
    ">": _GREATER,
    ">=": _GREATER | _EQUAL,
}

# --------------------------------------------------------------------------------------
# Jump names: generic spellings and direction variants
# --------------------------------------------------------------------------------------

if PY311:
    # 3.11: every POP_JUMP_* has a FORWARD and a BACKWARD opcode.
    _JUMP_VARIANTS: dict[str, tuple[str, str]] = {
        "JUMP": ("JUMP_FORWARD", "JUMP_BACKWARD"),
        "POP_JUMP_IF_FALSE": ("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE"),
        "POP_JUMP_IF_TRUE": ("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE"),
        "POP_JUMP_IF_NONE": ("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE"),
        "POP_JUMP_IF_NOT_NONE": (
            "POP_JUMP_FORWARD_IF_NOT_NONE",
            "POP_JUMP_BACKWARD_IF_NOT_NONE",
        ),
    }
else:
    # 3.12: conditional jumps are forward only; a backward one is assembled as the
    # negated forward jump over a JUMP_BACKWARD.
    _JUMP_VARIANTS = {"JUMP": ("JUMP_FORWARD", "JUMP_BACKWARD")}

#: real opname -> generic name ("POP_JUMP_FORWARD_IF_FALSE" -> "POP_JUMP_IF_FALSE",
#: "JUMP_BACKWARD" -> "JUMP"), for the opnames that have direction variants.
GENERIC_JUMP_NAME: dict[str, str] = {}
for _generic, (_fwd, _bwd) in _JUMP_VARIANTS.items():
    GENERIC_JUMP_NAME[_fwd] = _generic
    GENERIC_JUMP_NAME[_bwd] = _generic


def generic_opname(opname: str) -> str:
    """The version-independent spelling of a jump ("JUMP", "POP_JUMP_IF_FALSE", ...);
    other opnames are returned unchanged.  Handy as a key of per-opcode handler tables."""
    return GENERIC_JUMP_NAME.get(opname, opname)

#: conditional jumps without a backward variant on this version (FOR_ITER, SEND, 3.11's
#: JUMP_IF_*_OR_POP, 3.12's POP_JUMP_IF_*; the assembler rewrites the latter when needed).
FORWARD_ONLY_JUMPS = frozenset(n for n in CONDITIONAL_JUMPS if n not in GENERIC_JUMP_NAME)

#: 3.12: negations used to rewrite a backward conditional jump (3.11 has backward
#: variants instead).
NEGATED_POP_JUMP: dict[str, str] = {
    "POP_JUMP_IF_FALSE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_IF_TRUE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_IF_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_IF_NOT_NONE": "POP_JUMP_IF_NONE",
} if PY312 else {}


def normalize_opname(opname: str) -> str:
    """Map a generic spelling to this version's real opname.

    ``"JUMP"`` -> ``"JUMP_FORWARD"``; on 3.11 ``"POP_JUMP_IF_FALSE"`` ->
    ``"POP_JUMP_FORWARD_IF_FALSE"`` (the assembler later picks the direction that matches
    where the target lands).  Real opnames are returned unchanged; unknown names raise
    ``ValueError``.
    """
    if opname in OPMAP:
        return opname
    if opname in PSEUDO_OPNAMES:
        return PSEUDO_OPNAMES[opname]
    variants = _JUMP_VARIANTS.get(opname)
    if variants is not None:
        return variants[0]
    raise ValueError(f"unknown opcode name {opname!r} for Python {PY_VERSION[0]}.{PY_VERSION[1]}")


def jump_opname_for_direction(opname: str, backward: bool) -> str:
    """The variant of jump ``opname`` that goes in the given direction.

    Raises ``ValueError`` when this version has no such variant (e.g. ``FOR_ITER`` backward,
    or a 3.12 ``POP_JUMP_IF_*`` backward, which the assembler rewrites before asking).
    """
    generic = GENERIC_JUMP_NAME.get(opname)
    if generic is not None:
        fwd, bwd = _JUMP_VARIANTS[generic]
        return bwd if backward else fwd
    if backward:
        raise ValueError(f"{opname} cannot jump backward on Python {PY_VERSION[0]}.{PY_VERSION[1]}")
    return opname


def opcode_of(opname: str) -> int:
    return OPMAP[opname]


def cache_entries(opname: str) -> int:
    """Number of inline CACHE code units after ``opname``."""
    return CACHE_ENTRIES.get(opname, 0)


#: opcodes that take an argument (3.13's WITH_EXCEPT_START is above HAVE_ARGUMENT and takes
#: none; ``dis.hasarg`` exists from 3.12)
_HAS_ARG = frozenset(getattr(dis, "hasarg", range(HAVE_ARGUMENT, 256)))


def has_arg(opname: str) -> bool:
    return OPMAP[opname] in _HAS_ARG


# --------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------


def _opname(inst_or_name: Instruction | str) -> str:
    return inst_or_name if isinstance(inst_or_name, str) else inst_or_name.opname


def is_jump(inst: Instruction | str) -> bool:
    """Any instruction with a jump target (conditional or not, FOR_ITER and SEND included)."""
    return _opname(inst) in JUMPS


def is_conditional_jump(inst: Instruction | str) -> bool:
    return _opname(inst) in CONDITIONAL_JUMPS


def is_unconditional_jump(inst: Instruction | str) -> bool:
    return _opname(inst) in UNCONDITIONAL_JUMPS


def is_backward_jump(inst: Instruction | str) -> bool:
    return _opname(inst) in BACKWARD_JUMPS


def is_return(inst: Instruction | str) -> bool:
    return _opname(inst) in RETURNS


def is_raise(inst: Instruction | str) -> bool:
    return _opname(inst) in RAISES


def is_terminator(inst: Instruction | str) -> bool:
    """True when control never continues with the next instruction (jump, return, raise)."""
    return _opname(inst) in TERMINATORS


# --------------------------------------------------------------------------------------
# Arguments: decoding (arg -> argval) and encoding helpers
# --------------------------------------------------------------------------------------


def localsplus_names(varnames: Sequence[str], cellvars: Sequence[str],
                     freevars: Sequence[str]) -> list[str]:
    """Names of the frame's "fast locals plus" slots in slot order (3.11+).

    Locals first, then cell variables that are not also locals (a cell that is an argument
    shares the argument's slot), then free variables.  LOAD_FAST/STORE_FAST/LOAD_DEREF/
    LOAD_CLOSURE/MAKE_CELL/... arguments index this list.
    """
    names = list(varnames)
    seen = set(names)
    names.extend(c for c in cellvars if c not in seen)
    names.extend(freevars)
    return names


def name_arg_shift(opname: str) -> int:
    """How many flag bits sit under the co_names index in ``opname``'s argument."""
    return NAME_ARG_SHIFT.get(opname, 0)


def decode_compare(arg: int) -> str:
    return COMPARE_OPS[arg >> _COMPARE_SHIFT]


def encode_compare(op: str | int, to_bool: bool = False) -> int:
    """COMPARE_OP argument for operator ``op`` ("<", "==", ... or its cmp_op index);
    ``to_bool`` (3.13): the result converted to bool (ignored before 3.13)."""
    if isinstance(op, int):
        op = COMPARE_OPS[op]
    index = COMPARE_OPS.index(op)
    if PY312:
        arg = (index << _COMPARE_SHIFT) | _COMPARE_MASKS[op]
        return arg | COMPARE_TO_BOOL if to_bool else arg
    return index


def compare_to_bool(arg: int | None) -> bool:
    """Whether a decoded COMPARE_OP argument asks for a bool result (3.13's bit 4)."""
    return bool(COMPARE_TO_BOOL and arg is not None and arg & COMPARE_TO_BOOL)


def decode_paired_locals(arg: int, localsplus: Sequence[str]) -> tuple[str, str]:
    """The two local names of a 3.13 superinstruction's argument (first, second)."""
    return localsplus[arg >> 4], localsplus[arg & 15]


def encode_paired_locals(first: int, second: int) -> int | None:
    """The argument of a superinstruction over slots ``first`` and ``second``, or None when a
    slot does not fit in four bits (the instruction must then be split)."""
    if first > 15 or second > 15:
        return None
    return (first << 4) | second


def split_paired(inst: Instruction) -> list[Instruction]:
    """A 3.13 superinstruction as its two plain instructions (LOAD_FAST_LOAD_FAST (a, b) ->
    LOAD_FAST a; LOAD_FAST b).  The first is ``inst`` itself, changed in place (so jumps to it
    and its exception-table entry stay); the second is new, with the same positions and
    exception-table entry.  Any other instruction comes back alone."""
    from .instructions import Instruction

    pair = PAIRED_LOCAL_OPS.get(inst.opname)
    if pair is None:
        return [inst]
    first_name, second_name = inst.argval
    second = Instruction(pair[1], None, second_name, None, inst.positions, None,
                         inst.exn_tab_entry)
    inst.opname, inst.arg, inst.argval = pair[0], None, first_name
    return [inst, second]


def encode_binary_op(op: str | int) -> int:
    """BINARY_OP argument for ``op`` ("+", "*=", ... or the index itself)."""
    if isinstance(op, int):
        return op
    try:
        return BINARY_OPS.index(op)
    except ValueError:
        raise ValueError(f"unknown binary operator {op!r}; known: {BINARY_OPS}") from None


def argrepr(inst: Instruction) -> str:
    """A dis-like textual rendering of the instruction's argument."""
    name = inst.opname
    argval = inst.argval
    if name in JUMPS:
        t = inst.target
        if t is None:
            return "to ?"
        return f"to {t.offset}" if t.offset is not None else f"to {t!r}"
    if name in HAS_CONST:
        return _short_repr(argval)
    if name in HAS_NAME:
        arg = inst.arg or 0
        if name == "LOAD_GLOBAL" and arg & 1:
            return f"NULL + {argval}"
        if PY312 and name in ("LOAD_ATTR", "LOAD_SUPER_ATTR") and arg & 1:
            return f"{argval} + NULL|self"
        return str(argval)
    if name in PAIRED_LOCAL_OPS:
        return ", ".join(argval) if isinstance(argval, tuple) else str(argval)
    if name in HAS_LOCAL or name in HAS_FREE:
        return str(argval)
    if name in HAS_COMPARE:
        return f"bool({argval})" if compare_to_bool(inst.arg) else str(argval)
    if name == "BINARY_OP":
        try:
            return BINARY_OPS[encode_binary_op(argval)]
        except (IndexError, ValueError, TypeError):
            return str(argval)
    if name == "IS_OP":
        return "is not" if argval else "is"
    if name == "CONTAINS_OP":
        return "not in" if argval else "in"
    return ""


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------
# Stack effects
# --------------------------------------------------------------------------------------


def _arg_for_effect(inst: Instruction) -> int | None:
    name = inst.opname
    if not has_arg(name):
        return None
    if name in HAS_NAME:
        mask = (1 << name_arg_shift(name)) - 1
        return (inst.arg or 0) & mask
    if name in RESOLVED_ARG_OPS:
        return 0
    if inst.arg is not None:
        return inst.arg
    if name == "BINARY_OP":
        return 0
    if isinstance(inst.argval, int):
        return inst.argval
    return 0


def stack_effect(inst: Instruction, jump: bool | None = None) -> int:
    """Net stack effect of ``inst``; for jumps, ``jump=True`` is the taken branch,
    ``False`` the fall-through, ``None`` the larger of the two (like ``dis.stack_effect``)."""
    if inst.opname == "RETURN_GENERATOR":
        # The frame resumes after it with the value sent in on the stack, which the
        # following POP_TOP drops (the compiler adds this prologue after its own depth
        # computation, so dis.stack_effect says 0).
        return 1
    return dis.stack_effect(OPMAP[inst.opname], _arg_for_effect(inst), jump=jump)


# --------------------------------------------------------------------------------------
# Builders: each returns a list of new Instructions
# --------------------------------------------------------------------------------------


def _ci(opname: str, **kw: Any) -> Instruction:
    from .instructions import create_instruction

    return create_instruction(opname, **kw)


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
    return [_ci(CHECKED_LOAD_FAST if checked else "LOAD_FAST", argval=name)]


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
    if push_null and NULL_ABOVE_CALLABLE:
        return push_null_() + [_ci("LOAD_GLOBAL", arg=0, argval=name)]
    return [_ci("LOAD_GLOBAL", arg=1 if push_null else 0, argval=name)]


def load_attr(name: str) -> list[Instruction]:
    """``TOS = TOS.name``."""
    return [_ci("LOAD_ATTR", arg=0, argval=name)]


def load_method(name: str) -> list[Instruction]:
    """``obj -> [method, obj]`` or ``[NULL, attr]`` (3.13: ``[attr, NULL]``); follow with
    ``call_method(nargs)``."""
    if PY311:
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
    if not NULL_ABOVE_CALLABLE:
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
        insts += push_null() + rot_n(nargs + (1 if NULL_ABOVE_CALLABLE else 2))
    else:
        insts += _null_to_native(nargs + 1)
    if PY311:
        insts.append(_ci("PRECALL", arg=nargs))
    insts.append(_ci("CALL", arg=nargs))
    return insts


def call_method(nargs: int) -> list[Instruction]:
    """Call after ``load_method(name)`` and ``nargs`` pushed arguments (the method form's
    layout is native on every version)."""
    if PY311:
        return [_ci("PRECALL", arg=nargs), _ci("CALL", arg=nargs)]
    return [_ci("CALL", arg=nargs)]


def call_function_kw(nargs: int, kw_names: Sequence[str],
                     push_null_before: bool = False) -> list[Instruction]:
    """Call with ``nargs`` arguments in total, the last ``len(kw_names)`` passed by keyword.

    Stack as for :func:`call_function`.  Emits ``KW_NAMES`` right before the call
    (3.11: before ``PRECALL``); 3.13: the names as a constant, then ``CALL_KW``.
    """
    kw_names = tuple(kw_names)
    insts: list[Instruction] = []
    if push_null_before:
        insts += push_null() + rot_n(nargs + (1 if NULL_ABOVE_CALLABLE else 2))
    else:
        insts += _null_to_native(nargs + 1)
    if PY313:
        return insts + [_ci("LOAD_CONST", argval=kw_names), _ci("CALL_KW", arg=nargs)]
    insts.append(_ci("KW_NAMES", argval=kw_names))
    if PY311:
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
    return [_ci("TO_BOOL")] if PY313 else []


def return_value() -> list[Instruction]:
    return [_ci("RETURN_VALUE")]


def return_const(value: Any) -> list[Instruction]:
    """3.11: ``LOAD_CONST v; RETURN_VALUE``; 3.12+: ``RETURN_CONST v``."""
    if PY312:
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
    return [_ci("BINARY_OP", arg=encode_binary_op(op))]


def compare_op(op: str, to_bool: bool = False) -> list[Instruction]:
    """``COMPARE_OP``; ``to_bool``: the result converted to bool (3.13's flag bit; a bool
    already before 3.13 for the comparisons of builtin types, anything for others)."""
    return [_ci("COMPARE_OP", arg=encode_compare(op, to_bool), argval=op)]


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
        flags |= MAKE_FUNCTION_CLOSURE
    insts.append(_ci("LOAD_CONST", argval=code))
    if PY313:
        # 3.13: MAKE_FUNCTION takes only the code; each attribute is set after it
        insts.append(_ci("MAKE_FUNCTION"))
        if flags:
            insts.append(_ci("SET_FUNCTION_ATTRIBUTE", arg=flags))
        return insts
    insts.append(_ci("MAKE_FUNCTION", arg=flags))
    return insts


#: MAKE_FUNCTION's flags (3.11/3.12) and SET_FUNCTION_ATTRIBUTE's argument (3.13)
MAKE_FUNCTION_DEFAULTS = 0x01
MAKE_FUNCTION_KWDEFAULTS = 0x02
MAKE_FUNCTION_ANNOTATIONS = 0x04
MAKE_FUNCTION_CLOSURE = 0x08


def copy_free_vars(n: int) -> list[Instruction]:
    return [_ci("COPY_FREE_VARS", arg=n)] if n else []


def make_cells(cellvars: Sequence[str]) -> list[Instruction]:
    return [_ci("MAKE_CELL", argval=name) for name in cellvars]


def prologue(cellvars: Sequence[str], freevars: Sequence[str]) -> list[Instruction]:
    """The start every 3.11+ function needs: ``COPY_FREE_VARS``, ``MAKE_CELL`` per cell
    variable, then ``RESUME 0`` (the compiler's order)."""
    return copy_free_vars(len(freevars)) + make_cells(cellvars) + resume(0)
