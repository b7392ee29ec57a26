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
* MAKE_FUNCTION's flags.

The builders of generated code (``load_global``, ``call_function``, ...) live in
:mod:`.builders`, which asks this module which form to emit.
"""

from __future__ import annotations

import dis
import opcode as _opcode
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol


class InstructionLike(Protocol):
    """What this module reads of an instruction (``instructions.Instruction``, which imports
    this module, so this one names it by shape and imports nothing of the layer)."""

    opname: str
    arg: int | None
    argval: Any
    target: Any


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


def _opname(inst_or_name: InstructionLike | str) -> str:
    return inst_or_name if isinstance(inst_or_name, str) else inst_or_name.opname


def _member_test(opnames: frozenset[str], name: str,
                 doc: str) -> Callable[[InstructionLike | str], bool]:
    """``name(inst)``: whether ``inst`` (an instruction or an opname) is one of ``opnames``."""

    def test(inst: InstructionLike | str) -> bool:
        return _opname(inst) in opnames

    test.__name__ = test.__qualname__ = name
    test.__doc__ = doc
    return test


is_jump = _member_test(JUMPS, "is_jump", "Any instruction with a jump target (conditional or "
                       "not, FOR_ITER and SEND included).")
is_conditional_jump = _member_test(CONDITIONAL_JUMPS, "is_conditional_jump",
                                   "A jump that may fall through to the next instruction.")
is_unconditional_jump = _member_test(UNCONDITIONAL_JUMPS, "is_unconditional_jump",
                                     "A jump that always jumps.")
is_backward_jump = _member_test(BACKWARD_JUMPS, "is_backward_jump", "A jump to an earlier "
                                "instruction (a loop's back edge).")
is_return = _member_test(RETURNS, "is_return", "RETURN_VALUE, or RETURN_CONST where it exists.")
is_raise = _member_test(RAISES, "is_raise", "RAISE_VARARGS or RERAISE.")
is_terminator = _member_test(TERMINATORS, "is_terminator", "True when control never continues "
                             "with the next instruction (jump, return, raise).")


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


def encode_binary_op(op: str | int) -> int:
    """BINARY_OP argument for ``op`` ("+", "*=", ... or the index itself)."""
    if isinstance(op, int):
        return op
    try:
        return BINARY_OPS.index(op)
    except ValueError:
        raise ValueError(f"unknown binary operator {op!r}; known: {BINARY_OPS}") from None


def argrepr(inst: InstructionLike) -> str:
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


def _arg_for_effect(inst: InstructionLike) -> int | None:
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


def stack_effect(inst: InstructionLike, jump: bool | None = None) -> int:
    """Net stack effect of ``inst``; for jumps, ``jump=True`` is the taken branch,
    ``False`` the fall-through, ``None`` the larger of the two (like ``dis.stack_effect``)."""
    if inst.opname == "RETURN_GENERATOR":
        # The frame resumes after it with the value sent in on the stack, which the
        # following POP_TOP drops (the compiler adds this prologue after its own depth
        # computation, so dis.stack_effect says 0).
        return 1
    return dis.stack_effect(OPMAP[inst.opname], _arg_for_effect(inst), jump=jump)


#: MAKE_FUNCTION's flags (3.11/3.12) and SET_FUNCTION_ATTRIBUTE's argument (3.13)
MAKE_FUNCTION_DEFAULTS = 0x01
MAKE_FUNCTION_KWDEFAULTS = 0x02
MAKE_FUNCTION_ANNOTATIONS = 0x04
MAKE_FUNCTION_CLOSURE = 0x08
