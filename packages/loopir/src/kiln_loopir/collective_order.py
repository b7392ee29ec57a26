"""Where collectives run in a schedule: issued early, waited for late, so communication
overlaps compute (issue 29).

A functional collective (``torch.ops._c10d_functional.all_reduce``, ...) starts the
communication and returns at once; ``wait_tensor`` of its result blocks until it has arrived.
DTensor's redistributions are traced with the wait right after the collective, so
``overlap_collectives`` moves, in the buffer order the scheduler walks:

- each collective up, above the compute buffers it does not read, to just after its inputs
  exist;
- each ``wait_tensor`` down, below the compute buffers that do not read it, to just before
  its first reader.

Only compute that writes nothing but its own buffer is moved across (a kernel, not a scatter
into another buffer; a pure extern call such as a matmul, whose schema writes no argument and
returns no alias): never another collective or wait, so every rank issues its collectives in
the graph's order, and nothing that writes in place. A collective's input stays
alive until its wait (``pinned_by_collectives``): the memory planner never lends its storage
to a later buffer while the communication may still read it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .ir.values import Buffer, ComputedBuffer, ExternKernel, MultiOutput, ScatterBuffer

__all__ = ["COLLECTIVES", "WAIT", "is_collective", "overlap_collectives",
           "pinned_by_collectives"]


def _ops(names: Sequence[str]) -> frozenset:
    out = set()
    ns = torch.ops._c10d_functional
    for name in names:
        try:
            out.add(getattr(ns, name).default)
        except (AttributeError, RuntimeError):  # a torch built without distributed
            continue
    return frozenset(out)


#: collectives that start communication and return a tensor to wait for (single output)
COLLECTIVES = _ops(("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                    "all_to_all_single", "broadcast"))
WAIT = _ops(("wait_tensor",))


def is_collective(b: Buffer) -> bool:
    return isinstance(b, ExternKernel) and (b.op in COLLECTIVES or b.op in WAIT)


def _pure(op) -> bool:
    """The op writes none of its arguments and returns no alias of one (its schema says)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and not any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments) and \
        not any(r.alias_info is not None for r in schema.returns)


def _movable(b: Buffer) -> bool:
    """What a collective or a wait may cross: compute writing only its own buffer (a kernel,
    or a pure extern call such as a matmul, with its outputs)."""
    if isinstance(b, MultiOutput):
        return _movable(b.source)
    if isinstance(b, ExternKernel):
        return not is_collective(b) and _pure(b.op)
    return isinstance(b, ComputedBuffer) and not isinstance(b, ScatterBuffer)


def overlap_collectives(buffers: list[Buffer], reads: Callable[[Buffer], set[str]]
                        ) -> list[Buffer]:
    """``buffers`` reordered as the module docstring says; ``reads(b)``: the buffer names
    ``b`` reads."""
    if not any(is_collective(b) for b in buffers):
        return buffers
    bufs = list(buffers)
    read_sets = {b.name: reads(b) for b in bufs}
    # collectives up, in order (an earlier one settles first: they never pass each other)
    for i in range(len(bufs)):
        b = bufs[i]
        if not (isinstance(b, ExternKernel) and b.op in COLLECTIVES):
            continue
        j = i
        while j > 0 and _movable(bufs[j - 1]) and bufs[j - 1].name not in read_sets[b.name]:
            j -= 1
        if j < i:
            bufs.insert(j, bufs.pop(i))
    # waits down, last first
    for i in range(len(bufs) - 1, -1, -1):
        b = bufs[i]
        if not (isinstance(b, ExternKernel) and b.op in WAIT):
            continue
        j = i
        while j + 1 < len(bufs) and _movable(bufs[j + 1]) and \
                b.name not in read_sets[bufs[j + 1].name]:
            j += 1
        if j > i:
            bufs.insert(j, bufs.pop(i))
    return bufs


def pinned_by_collectives(buffers: Sequence[Buffer]) -> set[str]:
    """Buffers a collective reads: never lent to a later buffer (the communication may read
    them until its wait, which the reordering moved later)."""
    return {nm for b in buffers if isinstance(b, ExternKernel) and b.op in COLLECTIVES
            for nm in b.input_buffers()}
