"""Which local variables may still be read from a given instruction on (so a resume function
has to receive them)."""

from __future__ import annotations

from ..bytecode import versions

_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_CLOSURE",
                    "LOAD_DEREF", "DELETE_FAST", "LOAD_FROM_DICT_OR_DEREF", "MAKE_CELL"})
_WRITES = frozenset({"STORE_FAST"})


def _reads_writes(inst) -> tuple[set[str], set[str]]:
    """(names read, names written) by ``inst``; a 3.13 superinstruction over two locals counts
    as its two plain instructions (a store then a load of one name: the load reads the new
    value, so the name is not read before)."""
    parts = versions.PAIRED_LOCAL_OPS.get(inst.opname)
    if parts is not None:
        reads: set[str] = set()
        writes: set[str] = set()
        for opname, name in zip(parts, inst.argval, strict=True):
            if opname in _READS and name not in writes:
                reads.add(name)
            elif opname in _WRITES:
                writes.add(name)
        return reads, writes
    name = inst.argval if isinstance(inst.argval, str) else None
    return ({name} if inst.opname in _READS and name else set(),
            {name} if inst.opname in _WRITES and name else set())


def live_variables(instructions: list) -> list[frozenset[str]]:
    """``result[i]``: names that may be read at or after instruction ``i`` before being
    overwritten (backward data flow over jumps, fall-through and exception handlers)."""
    n = len(instructions)
    index = {id(inst): i for i, inst in enumerate(instructions)}
    succs: list[list[int]] = []
    for i, inst in enumerate(instructions):
        s: list[int] = []
        if not versions.is_terminator(inst) and i + 1 < n:
            s.append(i + 1)
        if versions.is_jump(inst) and inst.target is not None:
            s.append(index[id(inst.target)])
        entry = getattr(inst, "exn_tab_entry", None)
        if entry is not None:
            s.append(index[id(entry.target)])
        succs.append(s)
    reads = []
    writes = []
    for inst in instructions:
        r, w = _reads_writes(inst)
        reads.append(r)
        writes.append(w)
    live_in: list[set[str]] = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for i in range(n - 1, -1, -1):
            out: set[str] = set()
            for s in succs[i]:
                out |= live_in[s]
            new = reads[i] | (out - writes[i])
            if new != live_in[i]:
                live_in[i] = new
                changed = True
    return [frozenset(s) for s in live_in]
