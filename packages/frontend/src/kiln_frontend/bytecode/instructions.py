"""Instructions: the editable form of a code object's bytecode, and ``decode``."""

from __future__ import annotations

import dis
from dataclasses import dataclass
from types import CodeType
from typing import Any

from . import tables, versions

Positions = dis.Positions

_UNSET: Any = object()


@dataclass(eq=False)
class ExceptionTableEntry:
    """One exception-table range: instructions ``start`` .. ``end`` (inclusive) are covered;
    an exception there unwinds the stack to ``depth`` items, pushes the offset of the raising
    instruction when ``lasti`` is true, pushes the exception and jumps to ``target``."""

    start: Instruction
    end: Instruction
    target: Instruction
    depth: int
    lasti: bool

    def __repr__(self) -> str:
        return (
            f"ExceptionTableEntry({_where(self.start)} to {_where(self.end)} -> "
            f"{_where(self.target)} depth={self.depth}{' lasti' if self.lasti else ''})"
        )


@dataclass(eq=False)
class Instruction:
    """One bytecode instruction, without its CACHE entries and EXTENDED_ARG prefixes.

    * ``opname`` -- real opcode name for this Python version.
    * ``arg`` -- the integer argument as last encoded (``None`` for new instructions or
      argument-less opcodes).  The assembler recomputes it from ``argval``/``target`` for
      const/name/local/free/compare/jump opcodes; it only keeps the *flag bits* of
      ``LOAD_GLOBAL`` (bit 0: push NULL), 3.12+ ``LOAD_ATTR`` (bit 0: method load), 3.12+
      ``LOAD_SUPER_ATTR`` (bits 0-1) and 3.13 ``COMPARE_OP`` (bit 4: bool result).  For
      every other opcode ``arg`` is used as is.
    * ``argval`` of a 3.13 superinstruction over two locals (``LOAD_FAST_LOAD_FAST``, ...):
      the pair of names.
    * ``argval`` -- the resolved argument: the constant, the name, the local/cell/free
      variable name, the comparison operator string, or the jump target's offset for
      decoded jumps; otherwise the same as ``arg``.
    * ``offset`` -- byte offset in the decoded code object (of the opcode itself, after any
      EXTENDED_ARG prefix, as ``dis`` reports it); ``None`` for new instructions.
    * ``positions`` -- ``dis.Positions(lineno, end_lineno, col_offset, end_col_offset)`` or
      ``None`` (no location).
    * ``target`` -- the Instruction a jump goes to.
    * ``exn_tab_entry`` -- the ExceptionTableEntry covering this instruction, or None.
    """

    opname: str
    arg: int | None = None
    argval: Any = None
    offset: int | None = None
    positions: Positions | None = None
    target: Instruction | None = None
    exn_tab_entry: ExceptionTableEntry | None = None

    @property
    def opcode(self) -> int:
        return versions.OPMAP[self.opname]

    @property
    def lineno(self) -> int | None:
        return self.positions.lineno if self.positions is not None else None

    @property
    def argrepr(self) -> str:
        return versions.argrepr(self)

    def copy(self) -> Instruction:
        """A shallow copy (same target/exn_tab_entry objects)."""
        return Instruction(
            self.opname, self.arg, self.argval, self.offset, self.positions, self.target,
            self.exn_tab_entry,
        )

    def __repr__(self) -> str:
        parts = [self.opname]
        if self.target is not None:
            parts.append(f"-> {_where(self.target)}")
        elif self.opname in versions.OPMAP and versions.has_arg(self.opname):
            if self.opname in versions.RESOLVED_ARG_OPS:
                parts.append(versions._short_repr(self.argval, 40))
                shift = versions.name_arg_shift(self.opname)
                if shift and self.arg:
                    parts.append(f"flags={self.arg & ((1 << shift) - 1)}")
            else:
                parts.append(str(self.arg if self.arg is not None else self.argval))
                if self.opname == "BINARY_OP":
                    parts.append(f"({self.argrepr})")
        parts.append(f"@{self.offset}" if self.offset is not None else "@new")
        if self.lineno is not None:
            parts.append(f"line {self.lineno}")
        return f"Instruction({' '.join(parts)})"


def _where(inst: Instruction | None) -> str:
    if inst is None:
        return "?"
    if inst.offset is not None:
        return f"@{inst.offset}"
    return f"{inst.opname}@new"


def create_instruction(
    opname: str,
    *,
    arg: int | None = None,
    argval: Any = _UNSET,
    target: Instruction | None = None,
    positions: Positions | None = None,
) -> Instruction:
    """A new instruction (``offset=None``).

    ``opname`` may be a generic jump spelling (``"JUMP"``, and on 3.11
    ``"POP_JUMP_IF_FALSE"`` etc.); it is mapped to this version's real opname and the
    assembler picks the direction.  For opcodes whose argument is a plain integer
    (``BUILD_TUPLE``, ``CALL``, ``SWAP``, ...) give either ``arg`` or ``argval``; for
    const/name/local/free opcodes give ``argval`` (and, for ``LOAD_GLOBAL``/3.12
    ``LOAD_ATTR``/``LOAD_SUPER_ATTR``, the flag bits in ``arg``).  ``BINARY_OP`` also takes
    the operator symbol as ``argval`` (``"+"``), ``COMPARE_OP`` the comparison (``"<"``).
    """
    opname = versions.normalize_opname(opname)
    plain_int = opname not in versions.RESOLVED_ARG_OPS
    if argval is _UNSET:
        argval = None
        if plain_int:
            argval = arg
        elif opname in versions.HAS_COMPARE and arg is not None:
            argval = versions.decode_compare(arg)
    elif plain_int and arg is None and type(argval) is int and versions.has_arg(opname):
        arg = argval
    if opname == "BINARY_OP" and isinstance(argval, str):
        arg = versions.encode_binary_op(argval)
        argval = arg
    if target is not None and opname not in versions.JUMPS:
        raise ValueError(f"{opname} is not a jump but got a target")
    return Instruction(opname, arg, argval, None, positions, target)


# --------------------------------------------------------------------------------------
# decode
# --------------------------------------------------------------------------------------


def decode(code: CodeType) -> list[Instruction]:
    """The instructions of ``code``: CACHE entries dropped, EXTENDED_ARG folded into the
    argument, jump targets and exception-table entries resolved to Instruction objects.

    Offsets that name an EXTENDED_ARG prefix (jump targets, exception ranges) resolve to the
    instruction the prefix belongs to.
    """
    raw = code.co_code
    positions = list(code.co_positions())
    consts = code.co_consts
    names = code.co_names
    localsplus = versions.localsplus_names(code.co_varnames, code.co_cellvars, code.co_freevars)

    insts: list[Instruction] = []
    by_offset: dict[int, Instruction] = {}  # every code-unit offset an instruction owns
    jump_offsets: list[tuple[Instruction, int]] = []

    i = 0
    n = len(raw)
    ext = 0
    prefix_start: int | None = None
    while i < n:
        op = raw[i]
        oparg = raw[i + 1]
        if op == versions.EXTENDED_ARG:
            if prefix_start is None:
                prefix_start = i
            ext = (ext | oparg) << 8
            i += 2
            continue
        opname = versions.OPNAMES.get(op)
        if opname is None:
            raise ValueError(f"{code.co_name}: unknown opcode {op} at offset {i}")
        arg = (ext | oparg) if versions.has_arg(opname) else None
        first = i if prefix_start is None else prefix_start
        ext = 0
        prefix_start = None
        ncache = versions.cache_entries(opname)
        after = i + 2 + 2 * ncache
        pos = positions[i // 2]
        inst = Instruction(
            opname,
            arg,
            _decode_argval(opname, arg, consts, names, localsplus),
            i,
            None if pos == (None, None, None, None) else Positions(*pos),
        )
        if opname in versions.JUMPS:
            delta = 2 * arg
            dest = after - delta if opname in versions.BACKWARD_JUMPS else after + delta
            inst.argval = dest
            jump_offsets.append((inst, dest))
        insts.append(inst)
        for o in range(first, after, 2):
            by_offset[o] = inst
        i = after

    for inst, dest in jump_offsets:
        try:
            inst.target = by_offset[dest]
        except KeyError:
            raise ValueError(
                f"{code.co_name}: jump at offset {inst.offset} goes to {dest}, "
                "which is not an instruction"
            ) from None

    index_of = {id(inst): k for k, inst in enumerate(insts)}
    for start_off, end_off, target_off, depth, lasti in tables.parse_exception_table(
        code.co_exceptiontable
    ):
        first_inst = by_offset[start_off]
        last_inst = by_offset[end_off - 2]
        entry = ExceptionTableEntry(first_inst, last_inst, by_offset[target_off], depth, lasti)
        for k in range(index_of[id(first_inst)], index_of[id(last_inst)] + 1):
            insts[k].exn_tab_entry = entry
    return insts


def _decode_argval(opname: str, arg: int | None, consts: tuple, names: tuple,
                   localsplus: list[str]) -> Any:
    if arg is None:
        return None
    if opname in versions.HAS_CONST:
        return consts[arg]
    if opname in versions.HAS_NAME:
        return names[arg >> versions.name_arg_shift(opname)]
    if opname in versions.PAIRED_LOCAL_OPS:
        return versions.decode_paired_locals(arg, localsplus)
    if opname in versions.HAS_LOCAL or opname in versions.HAS_FREE:
        return localsplus[arg]
    if opname in versions.HAS_COMPARE:
        return versions.decode_compare(arg)
    return arg
