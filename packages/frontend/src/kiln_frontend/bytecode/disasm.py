"""``disassemble``: dis-like text for debug printouts (ORIGINAL/MODIFIED BYTECODE)."""

from __future__ import annotations

from collections.abc import Sequence
from types import CodeType

from .instructions import Instruction, decode


def disassemble(code_or_instructions: CodeType | Sequence[Instruction], *,
                recursive: bool = False) -> str:
    """Text like ``dis.dis``: line number where a line starts, ``>>`` on jump targets,
    offset (``new`` for instructions not yet assembled), opname, arg, argrepr, and the
    exception table.  ``recursive`` also disassembles nested code objects."""
    if isinstance(code_or_instructions, CodeType):
        code = code_or_instructions
        insts = decode(code)
        header = f"Disassembly of {code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    else:
        code = None
        insts = list(code_or_instructions)
        header = None
    lines: list[str] = [header] if header else []
    targets = {id(i.target) for i in insts if i.target is not None}
    targets |= {id(i.exn_tab_entry.target) for i in insts if i.exn_tab_entry is not None}
    last_line: int | None = None
    for inst in insts:
        line = inst.lineno
        if line is not None and line != last_line:
            if lines and last_line is not None:
                lines.append("")
            lineno_col = f"{line:>4}"
            last_line = line
        else:
            lineno_col = "    "
        mark = ">>" if id(inst) in targets else "  "
        off = "new" if inst.offset is None else str(inst.offset)
        arg = "" if inst.arg is None else str(inst.arg)
        rep = inst.argrepr
        text = f"{lineno_col} {mark} {off:>5} {inst.opname:<28} {arg:>5}"
        if rep:
            text += f" ({rep})"
        lines.append(text.rstrip())
    entries = []
    seen = set()
    for inst in insts:
        e = inst.exn_tab_entry
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            entries.append(e)
    if entries:
        lines.append("ExceptionTable:")
        for e in entries:
            lines.append(
                f"  {_at(e.start)} to {_at(e.end)} -> {_at(e.target)} [{e.depth}]"
                + (" lasti" if e.lasti else "")
            )
    if recursive and code is not None:
        for const in code.co_consts:
            if isinstance(const, CodeType):
                lines.append("")
                lines.append(disassemble(const, recursive=True))
    return "\n".join(lines)


def _at(inst: Instruction) -> str:
    return str(inst.offset) if inst.offset is not None else f"{inst.opname}@new"
