"""``assemble``: an instruction list back into a CodeType, and ``transform_code``."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

from . import builders, tables, versions
from .instructions import Instruction, Positions, decode

#: code fields that ``assemble`` computes itself; passing them is an error.
COMPUTED_FIELDS = frozenset(
    {"co_code", "co_linetable", "co_exceptiontable", "co_stacksize", "co_nlocals"}
)


class BytecodeError(ValueError):
    """The instruction list cannot be assembled into valid bytecode."""


# --------------------------------------------------------------------------------------
# Interning
# --------------------------------------------------------------------------------------

_VALUE_CONST_TYPES = (type(None), bool, int, str, bytes, type(Ellipsis))


def _const_key(value: Any) -> Any:
    """A key under which two constants are interchangeable (1, 1.0 and True differ; so do
    0.0 and -0.0).  Objects of other types (code objects included) are only equal to
    themselves."""
    t = type(value)
    if t is float:
        return (t, struct.pack("<d", value))
    if t is complex:
        return (t, struct.pack("<dd", value.real, value.imag))
    if t is tuple:
        return (t, tuple(_const_key(v) for v in value))
    if t is frozenset:
        return (t, frozenset(_const_key(v) for v in value))
    if t in _VALUE_CONST_TYPES:
        return (t, value)
    return ("id", id(value))


class _Table:
    """An append-only list with index lookup by key."""

    def __init__(self, initial: Sequence[Any], key: Callable[[Any], Any] = lambda v: v):
        self.items = list(initial)
        self.key = key
        self.index: dict[Any, int] = {}
        for k, v in enumerate(self.items):
            self.index.setdefault(key(v), k)

    def add(self, value: Any) -> int:
        k = self.key(value)
        i = self.index.get(k)
        if i is None:
            i = self.index[k] = len(self.items)
            self.items.append(value)
        return i


def _ext_count(arg: int) -> int:
    if arg < 0:
        raise BytecodeError(f"negative argument {arg}")
    if arg <= 0xFF:
        return 0
    if arg <= 0xFFFF:
        return 1
    if arg <= 0xFFFFFF:
        return 2
    if arg <= 0xFFFFFFFF:
        return 3
    raise BytecodeError(f"argument {arg} does not fit in 32 bits")


# --------------------------------------------------------------------------------------
# Jump preparation
# --------------------------------------------------------------------------------------


def _prepare_jumps(insts: list[Instruction]) -> tuple[list[Instruction], dict[int, Instruction]]:
    """Check targets, pick each jump's direction from the list order and (3.12) rewrite
    backward conditional jumps.  Returns the final list and a redirect map
    ``id(original target) -> instruction to jump to instead``."""
    index_of = {id(inst): k for k, inst in enumerate(insts)}
    if len(index_of) != len(insts):
        raise BytecodeError("the same Instruction object appears twice in the list")
    out: list[Instruction] = []
    redirect: dict[int, Instruction] = {}
    for k, inst in enumerate(insts):
        if inst.opname not in versions.OPMAP:
            inst.opname = versions.normalize_opname(inst.opname)
        if inst.opname not in versions.JUMPS:
            if inst.target is not None:
                raise BytecodeError(f"{inst!r} is not a jump but has a target")
            out.append(inst)
            continue
        target = inst.target
        if target is None or id(target) not in index_of:
            raise BytecodeError(f"jump {inst!r} has a target that is not in the list: {target!r}")
        backward = index_of[id(target)] <= k
        generic = versions.GENERIC_JUMP_NAME.get(inst.opname)
        if backward and inst.opname in versions.BACKWARD_JUMPS:
            out.append(inst)
        elif generic is not None:
            inst.opname = versions.jump_opname_for_direction(inst.opname, backward)
            out.append(inst)
        elif not backward:
            if inst.opname in versions.BACKWARD_JUMPS:  # JUMP_BACKWARD_NO_INTERRUPT
                inst.opname = "JUMP_FORWARD"
            out.append(inst)
        elif inst.opname in versions.NEGATED_POP_JUMP:
            # 3.12: "POP_JUMP_IF_X back" == "POP_JUMP_IF_NOT_X over; JUMP_BACKWARD back".
            if k + 1 >= len(insts):
                raise BytecodeError(f"{inst!r} is the last instruction and cannot fall through")
            skip = Instruction(
                versions.NEGATED_POP_JUMP[inst.opname], None, None, None, inst.positions,
                insts[k + 1], inst.exn_tab_entry,
            )
            back = Instruction(
                "JUMP_BACKWARD", None, None, None, inst.positions, target, inst.exn_tab_entry
            )
            redirect[id(inst)] = skip
            out += [skip, back]
        else:
            raise BytecodeError(f"{inst!r} cannot jump backward on this Python version")
    return out, redirect


# --------------------------------------------------------------------------------------
# assemble
# --------------------------------------------------------------------------------------


def assemble(instructions: Sequence[Instruction], template: CodeType, **fields: Any) -> CodeType:
    """Build a code object from ``instructions``, taking every field not computed here from
    ``template`` unless given in ``fields`` (``co_name="f"``, ``co_argcount=2``, ...).

    * ``co_consts``/``co_names``/``co_varnames``/``co_cellvars``/``co_freevars`` start from
      the template's (or the given) tuples; constants, names and local variables that the
      instructions use and that are missing are appended (new locals after the existing
      ones, so argument slots never move).  Cell/free variable names must be listed.
    * Jump arguments (with direction: 3.11 FORWARD/BACKWARD variants are chosen by where
      the target lands; a 3.12 backward POP_JUMP_IF_* becomes the negated jump over a
      JUMP_BACKWARD), EXTENDED_ARG prefixes, CACHE entries, ``co_stacksize``, the exception
      table and the location table are computed.
    * A new instruction (``offset is None``) without positions takes the line of the
      nearest earlier instruction that has one (or the next one, at the very start, or
      ``co_firstlineno`` when none has a line), so tracebacks through inserted code name a
      sensible line.  Decoded instructions keep their positions, ``None`` included.

    The instruction objects' ``arg`` is updated to the encoded value (and jump opnames to
    their direction variant); the list itself is not modified.
    """
    bad = COMPUTED_FIELDS.intersection(fields)
    if bad:
        raise TypeError(f"assemble computes {sorted(bad)} itself")
    insts, redirect = _prepare_jumps(list(instructions))

    def resolve(t: Instruction) -> Instruction:
        return redirect.get(id(t), t)

    get = lambda name: fields[name] if name in fields else getattr(template, name)  # noqa: E731
    consts = _Table(get("co_consts"), _const_key)
    names = _Table(get("co_names"))
    varnames = list(get("co_varnames"))
    cellvars = list(get("co_cellvars"))
    freevars = list(get("co_freevars"))
    firstlineno = get("co_firstlineno")

    # New local variables first (they shift cell and free slots).
    known = set(varnames) | set(cellvars) | set(freevars)
    for inst in insts:
        if inst.opname not in versions.HAS_LOCAL:
            continue
        paired = inst.opname in versions.PAIRED_LOCAL_OPS
        if paired and not (isinstance(inst.argval, tuple) and len(inst.argval) == 2):
            raise BytecodeError(f"{inst!r}: argval must be a pair of variable names")
        for local in inst.argval if paired else (inst.argval,):
            if local in known:
                continue
            if not isinstance(local, str):
                raise BytecodeError(f"{inst!r}: argval must be a variable name")
            varnames.append(local)
            known.add(local)
    slot_of: dict[str, int] = {}
    for k, name in enumerate(versions.localsplus_names(varnames, cellvars, freevars)):
        slot_of.setdefault(name, k)

    # 3.13 superinstructions whose slots moved past 15 (new arguments in front) become their
    # two plain instructions.
    if versions.PAIRED_LOCAL_OPS:
        expanded: list[Instruction] = []
        for inst in insts:
            if inst.opname in versions.PAIRED_LOCAL_OPS and versions.encode_paired_locals(
                    *(slot_of.get(v, 0) for v in inst.argval)) is None:
                expanded += builders.split_paired(inst)
            else:
                expanded.append(inst)
        insts = expanded

    # Arguments of everything but jumps.
    for inst in insts:
        name = inst.opname
        if name in versions.JUMPS:
            continue
        if not versions.has_arg(name):
            inst.arg = None
            continue
        argval = inst.argval
        if name in versions.HAS_CONST:
            hint = inst.arg
            if (hint is not None and hint < len(consts.items)
                    and consts.items[hint] is argval):
                continue
            inst.arg = consts.add(argval)
        elif name in versions.HAS_NAME:
            if not isinstance(argval, str):
                raise BytecodeError(f"{inst!r}: argval must be a name")
            shift = versions.name_arg_shift(name)
            flags = (inst.arg or 0) & ((1 << shift) - 1)
            inst.arg = (names.add(argval) << shift) | flags
        elif name in versions.PAIRED_LOCAL_OPS:
            first, second = (slot_of.get(v) for v in argval)
            if first is None or second is None:
                raise BytecodeError(f"{inst!r}: {argval!r} are not all variables")
            inst.arg = versions.encode_paired_locals(first, second)
        elif name in versions.HAS_LOCAL or name in versions.HAS_FREE:
            slot = slot_of.get(argval)
            if slot is None:
                raise BytecodeError(
                    f"{inst!r}: {argval!r} is not a cell or free variable; list it in "
                    "co_cellvars or co_freevars"
                )
            inst.arg = slot
        elif name in versions.HAS_COMPARE:
            inst.arg = versions.encode_compare(argval if argval is not None else inst.arg,
                                               versions.compare_to_bool(inst.arg))
        elif inst.arg is None:
            if name == "BINARY_OP" and isinstance(argval, str):
                inst.arg = versions.encode_binary_op(argval)
            elif isinstance(argval, int):
                inst.arg = argval
            else:
                raise BytecodeError(f"{inst!r} needs an integer argument")

    # Offsets, jump arguments and EXTENDED_ARG counts, until the sizes are stable.
    n = len(insts)
    index_of = {id(inst): k for k, inst in enumerate(insts)}
    _check_for_iter_exits(insts, index_of, resolve)
    caches = [versions.cache_entries(inst.opname) for inst in insts]
    ext = [_ext_count(inst.arg) if inst.arg is not None and inst.opname not in versions.JUMPS
           else 0 for inst in insts]
    jumps = [k for k, inst in enumerate(insts) if inst.opname in versions.JUMPS]
    targets = {k: index_of[id(resolve(insts[k].target))] for k in jumps}
    while True:
        starts = [0] * (n + 1)
        for k in range(n):
            starts[k + 1] = starts[k] + 2 * (ext[k] + 1 + caches[k])
        changed = False
        for k in jumps:
            inst = insts[k]
            after = starts[k + 1]
            dest = starts[targets[k]]
            delta = after - dest if inst.opname in versions.BACKWARD_JUMPS else dest - after
            if delta < 0:
                raise BytecodeError(f"{inst!r} jumps the wrong way")  # pragma: no cover
            inst.arg = delta // 2
            need = _ext_count(inst.arg)
            if need > ext[k]:
                ext[k] = need
                changed = True
        if not changed:
            break

    # co_code
    code = bytearray()
    for k, inst in enumerate(insts):
        arg = inst.arg or 0
        for shift in range(ext[k], 0, -1):
            code += bytes((versions.EXTENDED_ARG, (arg >> (8 * shift)) & 0xFF))
        code += bytes((versions.OPMAP[inst.opname], arg & 0xFF))
        code += bytes(2 * caches[k])  # CACHE is opcode 0 with argument 0

    # Exception table: runs of instructions with the same (handler, depth, lasti).
    entries = []
    run_key: tuple | None = None
    run_start = 0
    for k, inst in enumerate(insts + [None]):  # type: ignore[operator]
        e = inst.exn_tab_entry if inst is not None else None
        key = None
        if e is not None:
            handler = resolve(e.target)
            if id(handler) not in index_of:
                raise BytecodeError(f"exception handler of {inst!r} is not in the list")
            key = (index_of[id(handler)], e.depth, bool(e.lasti))
        if key != run_key:
            if run_key is not None:
                entries.append((starts[run_start], starts[k], starts[run_key[0]],
                                run_key[1], run_key[2]))
            run_key, run_start = key, k
    exceptiontable = tables.encode_exception_table(entries)

    # Location table.
    positions = _fill_positions(insts, firstlineno)
    linetable = tables.encode_location_table(
        (((starts[k + 1] - starts[k]) // 2, positions[k]) for k in range(n)),
        firstlineno,
        merge_runs=versions.LINETABLE_MERGES_RUNS,
    )

    stacksize = _stack_depth(insts, index_of, resolve)

    return template.replace(
        **{
            **fields,
            "co_code": bytes(code),
            "co_consts": tuple(consts.items),
            "co_names": tuple(names.items),
            "co_varnames": tuple(varnames),
            "co_cellvars": tuple(cellvars),
            "co_freevars": tuple(freevars),
            "co_nlocals": len(varnames),
            "co_stacksize": stacksize,
            "co_exceptiontable": exceptiontable,
            "co_linetable": linetable,
        }
    )


def _check_for_iter_exits(insts: list[Instruction], index_of: dict[int, int],
                          resolve: Callable[[Instruction], Instruction]) -> None:
    """An exhausted FOR_ITER skips the instructions after its target without running them
    (versions.FOR_ITER_SKIPS): anything else there would run on the wrong stack."""
    skips = versions.FOR_ITER_SKIPS
    for inst in insts:
        if inst.opname != "FOR_ITER":
            continue
        k = index_of[id(resolve(inst.target))]
        found = tuple(i.opname for i in insts[k:k + len(skips)])
        if found != skips:
            raise BytecodeError(f"{inst!r} must jump to {' '.join(skips)}, not {' '.join(found)}")


def _fill_positions(insts: list[Instruction], firstlineno: int) -> list[Positions | None]:
    out: list[Positions | None] = [inst.positions for inst in insts]
    last_line: int | None = None
    pending: list[int] = []
    for k, inst in enumerate(insts):
        pos = inst.positions
        if pos is not None and pos.lineno is not None:
            last_line = pos.lineno
            if pending:
                for j in pending:
                    out[j] = Positions(last_line, last_line, None, None)
                pending = []
        elif inst.offset is None:
            if last_line is not None:
                out[k] = Positions(last_line, last_line, None, None)
            else:
                pending.append(k)
    for j in pending:  # no line anywhere: use the first line
        out[j] = Positions(firstlineno, firstlineno, None, None)
    return out


def stack_depths(instructions: Sequence[Instruction]) -> list[int | None]:
    """Stack depth before each instruction (``None`` where unreachable), found by walking
    every path from the first instruction (fall-through, jumps, exception handlers).
    Raises BytecodeError where paths disagree or the stack underflows."""
    insts = list(instructions)
    index_of = {id(inst): k for k, inst in enumerate(insts)}
    depth: list[int | None] = [None] * len(insts)
    _stack_depth(insts, index_of, lambda t: t, depth)
    return depth


def _stack_depth(insts: list[Instruction], index_of: dict[int, int],
                 resolve: Callable[[Instruction], Instruction],
                 depth: list[int | None] | None = None) -> int:
    """Maximum stack depth by walking every path (normal flow, jumps and exception edges).
    Raises BytecodeError when two paths reach an instruction with different depths."""
    n = len(insts)
    if n == 0:
        return 0
    if depth is None:
        depth = [None] * n
    max_depth = 0
    work: list[int] = []

    def reach(k: int, d: int, src: int) -> None:
        nonlocal max_depth
        if k >= n:
            raise BytecodeError(f"control falls off the end after {insts[src]!r}")
        if d < 0:
            raise BytecodeError(f"stack underflow reaching {insts[k]!r} from {insts[src]!r}")
        if depth[k] is None:
            depth[k] = d
            max_depth = max(max_depth, d)
            work.append(k)
        elif depth[k] != d:
            raise BytecodeError(
                f"inconsistent stack depth at {insts[k]!r}: {depth[k]} and {d} "
                f"(from {insts[src]!r})"
            )

    reach(0, 0, 0)
    while work:
        k = work.pop()
        inst = insts[k]
        d = depth[k]
        assert d is not None
        e = inst.exn_tab_entry
        if e is not None:
            reach(index_of[id(resolve(e.target))], e.depth + 1 + int(bool(e.lasti)), k)
        if inst.opname in versions.JUMPS:
            after_jump = d + versions.stack_effect(inst, jump=True)
            max_depth = max(max_depth, after_jump)
            reach(index_of[id(resolve(inst.target))], after_jump, k)
        if inst.opname not in versions.TERMINATORS:
            after = d + versions.stack_effect(inst, jump=False)
            max_depth = max(max_depth, after)
            reach(k + 1, after, k)
    return max_depth


# --------------------------------------------------------------------------------------
# transform_code
# --------------------------------------------------------------------------------------

#: the code fields a transform may read and change through ``code_options``
CODE_OPTION_FIELDS = (
    "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags", "co_name",
    "co_qualname", "co_filename", "co_firstlineno", "co_consts", "co_names", "co_varnames",
    "co_cellvars", "co_freevars",
)


def transform_code(
    code: CodeType, transform: Callable[[list[Instruction], dict[str, Any]], Any]
) -> CodeType:
    """Decode ``code``, let ``transform(instructions, code_options)`` edit the list in place
    (and the ``co_*`` entries of ``code_options``, e.g. ``co_varnames`` to add arguments),
    then assemble the result with ``code`` as template."""
    instructions = decode(code)
    options = {name: getattr(code, name) for name in CODE_OPTION_FIELDS}
    transform(instructions, options)
    return assemble(instructions, code, **options)
