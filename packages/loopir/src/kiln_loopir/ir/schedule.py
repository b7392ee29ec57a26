"""The schedule of the loop IR: ``Schedule``, what ``kiln_loopir.scheduler.schedule`` makes of a
LoopGraph (the last phase of ``kiln_loopir.ir``): ordered steps, each a ``FusedGroup`` (one
loop nest running ``SchedNode``s) or an ``ExternNode`` (an extern call), and the memory plan
(``Allocation``s per step, frees after each step). Printed by ``printer``, checked by
``verify.verify_schedule``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ..analysis import MemoryDep
from ..sizevars import free_size_symbols, index_symbol
from .graph import LoopGraph
from .printer import extern_text, group_text, sched_node_text, schedule_text
from .values import ComputedBuffer, ExternKernel, Layout, MultiOutput, Reduction
from .verify import verify_schedule


@dataclass
class SchedNode:
    """One ComputedBuffer inside a FusedGroup.

    ``body(outer_index, inner_index)`` calls ``ops``: loads, compute and ``ops.store`` (for a
    pointwise node, once per (outer, inner) point) or ``ops.reduction`` + ``ops.store_reduction``
    (a reduction node: the value is reduced over the inner ranges; the store happens once per
    outer point, after the inner loop).
    """

    buffer: ComputedBuffer
    kind: str  # "pointwise" | "reduction"
    inner: list[sympy.Expr]
    body: Callable[[list, list], Any]
    reads: list[MemoryDep] = field(default_factory=list)
    writes: list[MemoryDep] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def reduction_type(self) -> str | None:
        d = self.buffer.data
        return d.reduction_type if isinstance(d, Reduction) else None

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.layout.dtype

    def text(self, outer_syms, indent="  ") -> list[str]:
        return sched_node_text(self, outer_syms, indent)


@dataclass
class Allocation:
    """Memory plan entry: allocate buffer ``name`` with ``layout`` before its step, or take
    over the storage of the freed buffer ``reuses`` (same storage size, dtype and device).
    ``internal``: the buffer lives only inside one FusedGroup (see FusedGroup.internal_buffers).
    ``in_place``: ``reuses`` is read by this very step (its last use) and dies after it: the
    step writes each element over the one it reads (``scheduler.in_place_source``)."""

    name: str
    layout: Layout
    reuses: str | None = None
    internal: bool = False
    in_place: bool = False

    def __str__(self) -> str:
        r = f" reuses {self.reuses}" if self.reuses else ""
        r += " in place" if self.in_place else ""
        i = " internal" if self.internal else ""
        return f"alloc {self.name} {self.layout}{r}{i}"


class _ScheduleStep:
    """What the schedule's steps share: the buffers freed after the step, the text form."""

    frees: list[str]

    def __str__(self) -> str:
        return "\n".join(self.text())


@dataclass
class FusedGroup(_ScheduleStep):
    """A loop nest over ``outer`` (parallel) running ``nodes`` in order per outer point."""

    name: str
    outer: list[sympy.Expr]
    nodes: list[SchedNode]
    device: torch.device = torch.device("cpu")
    reads: list[MemoryDep] = field(default_factory=list)  # reads of buffers from outside the group
    writes: list[MemoryDep] = field(default_factory=list)  # all stores
    internal_buffers: set[str] = field(default_factory=set)
    allocations: list[Allocation] = field(default_factory=list)
    frees: list[str] = field(default_factory=list)  # buffers dead after this step

    kind = "group"

    @property
    def outer_symbols(self) -> list[sympy.Symbol]:
        return [index_symbol(k) for k in range(len(self.outer))]

    def buffer_names(self) -> list[str]:
        return [n.buffer.name for n in self.nodes]

    def input_names(self) -> list[str]:
        """Buffers read from outside the group (order of first read)."""
        out: list[str] = []
        for d in self.reads:
            if d.name not in out:
                out.append(d.name)
        return out

    def output_names(self) -> list[str]:
        """Buffers written by the group that are needed outside it (for a ScatterBuffer node:
        the buffer it writes into)."""
        out = []
        for n in self.nodes:
            nm = getattr(n.buffer, "mutated_name", n.buffer.name)
            if nm not in self.internal_buffers and nm not in out:
                out.append(nm)
        return out

    def size_symbols(self) -> list[sympy.Symbol]:
        """Size symbols (``s*``) used by ranges and indices of this group, sorted."""
        exprs = list(self.outer)
        for n in self.nodes:
            exprs += list(n.inner)
            exprs += [d.index for d in n.reads] + [d.index for d in n.writes]
        return free_size_symbols(exprs)

    def is_reduction(self) -> bool:
        return any(n.kind == "reduction" for n in self.nodes)

    def text(self, indent="  ") -> list[str]:
        return group_text(self, indent)


@dataclass
class ExternNode(_ScheduleStep):
    """A step calling an ExternKernel (and binding its MultiOutputs)."""

    kernel: ExternKernel
    allocations: list[Allocation] = field(default_factory=list)  # always empty: aten allocates
    frees: list[str] = field(default_factory=list)

    kind = "extern"

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def outputs(self) -> list[MultiOutput]:
        return self.kernel.outputs

    @property
    def reads(self) -> list[str]:
        return self.kernel.input_buffers()

    @property
    def writes(self) -> list[str]:
        return [self.kernel.name] + [m.name for m in self.kernel.outputs]

    def text(self, indent="  ") -> list[str]:
        return extern_text(self, indent)




def _of_graph(field: str) -> property:
    """A read-only view of the scheduled graph's ``field`` on the Schedule."""
    return property(lambda self: getattr(self.graph, field),
                    doc=f"the scheduled graph's {field}")


@dataclass
class Schedule:
    """Ordered steps (FusedGroup | ExternNode) + memory plan, for one LoopGraph."""

    graph: LoopGraph
    steps: list[FusedGroup | ExternNode]

    @property
    def groups(self) -> list[FusedGroup]:
        return [s for s in self.steps if isinstance(s, FusedGroup)]

    @property
    def externs(self) -> list[ExternNode]:
        return [s for s in self.steps if isinstance(s, ExternNode)]

    # what a schedule reads of the graph it orders, by the graph's own names
    inputs = _of_graph("inputs")
    outputs = _of_graph("outputs")
    sizevars = _of_graph("sizevars")
    device = _of_graph("device")

    def lint(self) -> None:
        """Check the schedule: ``verify.verify_schedule`` (raises ``IRVerifyError``)."""
        verify_schedule(self)

    def memory_plan(self) -> list[tuple[str, list[Allocation], list[str]]]:
        """Per step: (step name, allocations before it, buffers freed after it)."""
        return [(s.name, list(s.allocations), list(s.frees)) for s in self.steps]

    def __str__(self) -> str:
        return schedule_text(self)

    __repr__ = __str__
