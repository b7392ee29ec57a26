"""kiln-loopir: ATen FX graph -> define-by-run loop IR -> schedule (fusion, memory plan).

    graph = kiln_loopir.lower(aten_gm)          # LoopGraph (print(graph) for its text form)
    sched = kiln_loopir.schedule(graph)         # Schedule: FusedGroups / ExternNodes + memory plan
    fn = kiln_loopir.interpret(sched)           # reference executor (torch ops), any device
    module = kiln_loopir.generate_wrapper(sched, codegen)   # GeneratedModule (see codegen_protocol)
"""

from __future__ import annotations

from . import ir, ops_spec, sizevars, virtualized
from .codegen_protocol import Codegen, GeneratedModule, KernelDef
from .counters import counters
from .ir import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    ExternNode,
    FusedGroup,
    InputBuffer,
    Layout,
    LoopGraph,
    MemoryDep,
    MultiOutput,
    Pointwise,
    Reduction,
    ReinterpretView,
    SchedNode,
    Schedule,
)
from .lowering import LoweringError
from .virtualized import MissingOpError, ops, set_ops_handler

__all__ = [
    "lower",
    "schedule",
    "interpret",
    "generate_wrapper",
    "compile_guarded",
    "counters",
    "Codegen",
    "GeneratedModule",
    "KernelDef",
    "Buffer",
    "ComputedBuffer",
    "ConstantBuffer",
    "ExternKernel",
    "ExternNode",
    "FusedGroup",
    "InputBuffer",
    "Layout",
    "LoopGraph",
    "MemoryDep",
    "MultiOutput",
    "Pointwise",
    "Reduction",
    "ReinterpretView",
    "Schedule",
    "SchedNode",
    "MissingOpError",
    "LoweringError",
    "ops",
    "set_ops_handler",
    "ir",
    "ops_spec",
    "sizevars",
    "virtualized",
]


def lower(aten_gm, example_inputs=None):
    """ATen FX GraphModule -> LoopGraph (see kiln_loopir.graph_lowering.lower)."""
    from .graph_lowering import lower as _lower

    return _lower(aten_gm, example_inputs)


def compile_guarded(aten_gm, compile_schedule, guard):
    """Lower and schedule ``aten_gm`` and compile it with a codegen's ``compile_schedule``.
    Constants computed from weights at compile time (a weight packed or stored in another
    layout) do not see an in-place write to the weight, so ``guard`` (the runtime's
    ``WeightsGuard.around``: loopir knows no runtime) wraps the result to compile again."""
    from .derived_constants import constant_reads

    sched = schedule(lower(aten_gm))
    computed_from, reads = constant_reads(sched.graph, aten_gm)  # weights copied or packed
    return guard(compile_schedule(sched),  # into constants, or read as ones
                 lambda: compile_guarded(aten_gm, compile_schedule, guard), computed_from,
                 views=reads)


def schedule(graph):
    """LoopGraph -> Schedule (see kiln_loopir.scheduler.schedule)."""
    from .scheduler import schedule as _schedule

    return _schedule(graph)


def interpret(sched):
    """Schedule (or LoopGraph) -> callable(*inputs) -> list[Tensor], running torch ops."""
    from .interpreter import interpret as _interpret

    return _interpret(sched)


def generate_wrapper(sched, codegen):
    """Schedule + Codegen -> GeneratedModule (kiln_loopir.wrapper, written by H5)."""
    from .wrapper import generate_wrapper as _generate_wrapper

    return _generate_wrapper(sched, codegen)
