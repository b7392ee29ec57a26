"""``make_resume_code``: continuation code objects for graph breaks.

A resume function continues a frame of ``code`` at instruction ``target`` from a state that
its caller passes in as arguments: first the values that were on the stack (bottom first),
then the live local variables.  Its code is

    COPY_FREE_VARS n            (when the continuation has free variables)
    RESUME 0
    LOAD_FAST <stack var>...    (PUSH_NULL for a NULL stack slot)
    JUMP_FORWARD target
    ...every instruction of the original reachable from target (jumps back into loops
    included), with the exception-table entries that cover them...

Cell and free variables: every cell variable and every free variable of the original
becomes a *free* variable of the continuation (``co_freevars == code.co_cellvars +
code.co_freevars``), so the continuation shares the cells with the original frame and with
closures created before the break.  Build the function in the original (transformed) frame
with ``builders.make_function(resume_code, resume_code.co_freevars)`` (``LOAD_CLOSURE``
pushes each cell), or outside with
``types.FunctionType(resume_code, globals, name, None, closure)`` where ``closure`` is the
tuple of cells for ``resume_code.co_freevars`` in order (for an original without cell
variables that is just the original function's ``__closure__``).  When
``resume_code.co_freevars`` is empty the function needs no closure and can be installed as a
global.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from types import CodeType

from . import builders, versions
from .assemble import BytecodeError, assemble
from .instructions import (
    ExceptionTableEntry,
    Instruction,
    Positions,
    create_instruction,
    decode,
)

#: prefix of the argument that stands in for a live cell/free variable
_IGNORED_ARG = "___closure_var_"

_UNSUPPORTED_FLAGS = (
    inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


def make_resume_code(
    code: CodeType,
    target: Instruction | int,
    stack_vars: Sequence[str | None | Sequence[Instruction]],
    live_locals: Sequence[str],
    name: str,
    *,
    qualname: str | None = None,
    _after: tuple[int, Sequence[Instruction], Sequence[str]] | None = None,
    _paused_yield: int | None = None,
) -> CodeType:
    """Continuation of ``code`` at ``target`` (an Instruction decoded from ``code``, or its
    offset).

    ``stack_vars``: one entry per stack slot at ``target``, bottom first: an argument name
    for the value (must not be a name ``code`` already uses), ``None`` for a NULL slot
    (pushed with PUSH_NULL; it takes no argument), or a list of instructions that push
    the value (a ``with`` block's ``__exit__`` re-entered in the prologue; no argument).  ``live_locals``: local variables to
    pass in, after the stack values.  Cell and free variables travel in the closure (see
    the module docstring); when listed in ``live_locals`` their argument is accepted and
    ignored (the variable reads the shared cell).  The result takes
    ``[s for s in stack_vars if s] + live_locals`` as positional arguments; its name is
    ``name`` (e.g. ``__resume_at_<offset>_<n>``), its qualname ``qualname`` or ``name``.
    Raises ``BytecodeError`` when the stack layout does not fit the code after ``target``.
    Locals that are not passed start unbound; reading one raises UnboundLocalError.
    """
    unsupported = _UNSUPPORTED_FLAGS & ~(inspect.CO_GENERATOR if _paused_yield is not None
                                         else 0)
    if code.co_flags & unsupported:
        raise BytecodeError(f"{code.co_name}: resume code for generators/coroutines is not supported")
    offset = target if isinstance(target, int) else target.offset
    if offset is None:
        raise BytecodeError(f"resume target {target!r} has no offset in {code.co_name}")

    original = decode(code)
    try:
        start = next(k for k, inst in enumerate(original) if inst.offset == offset)
    except StopIteration:
        raise BytecodeError(f"{code.co_name}: no instruction at offset {offset}") from None
    paused: list[Instruction] = []  # the generator's YIELD_VALUE and the RESUME after it
    if _paused_yield is not None:
        paused = original[start - 2:start]
        if start < 2 or paused[0].offset != _paused_yield or \
                paused[0].opname != "YIELD_VALUE" or paused[1].opname != "RESUME":
            raise BytecodeError(f"{code.co_name}: no YIELD_VALUE; RESUME before offset {offset}")

    closure_names = tuple(code.co_cellvars) + tuple(code.co_freevars)
    closure_set = set(closure_names)
    stack_names = [s for s in stack_vars if isinstance(s, str)]
    used_names = set(code.co_varnames) | closure_set
    for s in stack_names:
        if s in used_names:
            raise BytecodeError(f"stack variable name {s!r} is already used by {code.co_name}")
    # A cell/free variable listed as live keeps its argument slot (so argument positions
    # stay what the caller built) under a placeholder name; its value comes from the cell.
    live_args = [_IGNORED_ARG + s if s in closure_set else s for s in live_locals]
    arg_names = stack_names + live_args
    if len(set(arg_names)) != len(arg_names):
        raise BytecodeError(f"duplicate argument names: {arg_names}")
    passed = set(arg_names)
    varnames = arg_names + [
        v for v in code.co_varnames if v not in closure_set and v not in passed
    ] + (list(_after[2]) if _after is not None else [])

    handlers = [original.index(inst.exn_tab_entry.target) for inst in paused
                if inst.exn_tab_entry is not None]
    body, first, copies = _reachable_copy(original, start, handlers)
    extra_varnames: list[str] = []
    if _after is not None:  # make_reentry_code: a tail after the instruction at this offset
        last_offset, tail, extra_varnames = _after
        k = next((i for i, inst in enumerate(body)
                  if getattr(inst, "offset", None) == last_offset), None)
        if k is None:
            raise BytecodeError(f"{code.co_name}: no instruction at offset {last_offset}")
        tail = [inst.copy() for inst in tail]
        for inst in tail:
            inst.positions = body[k].positions
            inst.exn_tab_entry = None
        body = body[:k + 1] + tail + body[k + 1:]
    # 3.13's superinstructions over two locals become plain loads and stores, so the rule
    # below sees each read (and no slot of the new argument order has to fit in 4 bits).
    body = [part for inst in body for part in builders.split_paired(inst)]
    # The compiler proved locals bound from the original entry; here only the arguments
    # are, so every other local read must check (3.12+'s LOAD_FAST does not).  A 3.13
    # LOAD_FAST of a cell or free variable loads the cell, which the closure provides.
    for inst in body:
        if (inst.opname == "LOAD_FAST" and inst.argval not in passed
                and inst.argval not in closure_set):
            inst.opname = versions.CHECKED_LOAD_FAST
    prologue: list[Instruction] = builders.copy_free_vars(len(closure_names))
    if paused:
        prologue += [create_instruction("RETURN_GENERATOR")] + builders.pop_top()
    prologue += builders.resume(0)
    for s in stack_vars:
        if s is None:
            prologue += builders.push_null()
        elif isinstance(s, str):
            prologue += builders.load_fast(s)
        else:
            prologue += [inst.copy() for inst in s]
    if paused:
        # paused again at a yield of its own, under the original's handler (a throw() or
        # close() there runs the original's except/finally), after a first next()
        prologue += builders.load_const(None)
        for inst in paused:
            new = create_instruction(inst.opname, arg=inst.arg, argval=inst.argval)
            e = inst.exn_tab_entry
            if e is not None:
                new.exn_tab_entry = ExceptionTableEntry(new, new, copies[id(e.target)],
                                                        e.depth, e.lasti)
            prologue.append(new)
    prologue.append(create_instruction("JUMP_FORWARD", target=first))
    if first.lineno is not None:
        for inst in prologue:
            inst.positions = Positions(first.lineno, first.lineno, None, None)

    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    return assemble(
        prologue + body,
        code,
        co_argcount=len(arg_names),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=flags,
        co_name=name,
        co_qualname=qualname or name,
        co_varnames=tuple(varnames),
        co_cellvars=(),
        co_freevars=closure_names,
    )


def _reachable_copy(insts: list[Instruction], start: int, also: Sequence[int] = ()
                    ) -> tuple[list[Instruction], Instruction, dict[int, Instruction]]:
    """Copies of the instructions reachable from ``insts[start]`` (and from ``also``;
    fall-through, jumps and exception handlers) in their original order, the copy of
    ``insts[start]``, and the copies by id of their original.  Targets and exception-table
    entries point at the copies; entries are narrowed to the kept instructions."""
    index_of = {id(inst): k for k, inst in enumerate(insts)}
    keep = [False] * len(insts)
    work = [start, *also]
    while work:
        k = work.pop()
        if k >= len(insts) or keep[k]:
            continue
        keep[k] = True
        inst = insts[k]
        if inst.target is not None:
            work.append(index_of[id(inst.target)])
        if inst.exn_tab_entry is not None:
            work.append(index_of[id(inst.exn_tab_entry.target)])
        if not versions.is_terminator(inst):
            work.append(k + 1)

    order = [k for k in range(len(insts)) if keep[k]]
    copies = {id(insts[k]): insts[k].copy() for k in order}
    entries: dict[int, ExceptionTableEntry] = {}
    out = []
    for k in order:
        new = copies[id(insts[k])]
        if new.target is not None:
            new.target = copies[id(new.target)]
        e = new.exn_tab_entry
        if e is not None:
            ne = entries.get(id(e))
            if ne is None:
                ne = entries[id(e)] = ExceptionTableEntry(
                    new, new, copies[id(e.target)], e.depth, e.lasti
                )
            ne.end = new
            new.exn_tab_entry = ne
        out.append(new)
    return out, copies[id(insts[start])], copies



def make_generator_resume_code(
    code: CodeType,
    paused_yield: Instruction | int,
    stack_vars: Sequence[str | None],
    live_locals: Sequence[str],
    name: str,
    *,
    qualname: str | None = None,
) -> CodeType:
    """A generator function that rebuilds a generator of ``code`` paused at the
    ``YIELD_VALUE`` ``paused_yield`` (an Instruction decoded from ``code``, or its offset).

    Called with the stack values below the yielded one and the live locals (as
    ``make_resume_code``), it makes a generator whose first ``next()`` restores them and
    stops at a yield of its own (yielding None) under the original yield's exception
    handler; from then on the generator is the original one paused there: the value a
    later ``send`` gives is what the original ``yield`` evaluates to, and ``throw``/
    ``close`` raise where the original would."""
    offset = paused_yield if isinstance(paused_yield, int) else paused_yield.offset
    if offset is None:
        raise BytecodeError(f"paused yield {paused_yield!r} has no offset in {code.co_name}")
    insts = decode(code)
    k = next((i for i, inst in enumerate(insts) if inst.offset == offset), None)
    if k is None or k + 2 >= len(insts):
        raise BytecodeError(f"{code.co_name}: no instruction after the yield at {offset}")
    return make_resume_code(code, insts[k + 2], stack_vars, live_locals, name,
                            qualname=qualname, _paused_yield=offset)


def make_reentry_code(
    code: CodeType,
    first: Instruction | int,
    last: int,
    stack_vars: Sequence[str | None],
    live_locals: Sequence[str],
    n_after: int,
    continuation: Sequence[Instruction],
    name: str,
    *,
    close_slots: Sequence[int] = (),
) -> CodeType:
    """Run the instructions of ``code`` from ``first`` to the one at offset ``last`` (an
    unsupported call and its prefix, inside a ``with`` block), covered by the block's own
    exception-table entry, then call the continuation and return its result.

    Like ``make_resume_code(code, first, stack_vars, live_locals, name)``, except that
    after ``last`` the ``n_after`` values then on the stack (none of them NULL) go to
    temporaries and the continuation (``continuation``: instructions that push it, NULL
    first) is called with them and then ``live_locals``. Only the call is covered by the
    block's handler: an exception there leaves through the block's ``__exit__`` (a stack
    value, as in the original frame); one in the continuation leaves through the
    continuation's own copy of the handler, never through both. ``close_slots``: the stack
    slots of the ``__exit__`` of the blocks around the call, innermost first (nested
    blocks), each called with three Nones after the call in that order (the blocks are
    left) and not passed on (the continuation enters them anew in its prologue)."""
    temps = [f"___kiln_reentry_{i}" for i in range(n_after)]
    tail: list[Instruction] = []
    for t in reversed(temps):
        tail += builders.store_fast(t)
    for slot in close_slots:
        tail += builders.push_null() + builders.load_fast(temps[slot])
        for _ in range(3):
            tail += builders.load_const(None)
        tail += builders.call_function(3) + builders.pop_top()
    passed = [t for i, t in enumerate(temps) if i not in close_slots]
    tail += list(continuation)
    for t in passed:
        tail += builders.load_fast(t)
    for local in live_locals:
        tail += builders.load_fast(local)
    tail += builders.call_function(len(passed) + len(live_locals))
    tail += builders.return_value()
    return make_resume_code(code, first, stack_vars, live_locals, name,
                            _after=(last, tail, temps))
