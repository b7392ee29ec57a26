"""kiln's define-by-run loop IR, one module per phase (each imports only those before it):

* ``values``: layouts, buffers, loop bodies (``Pointwise``/``Reduction``) and the views
  lowering passes around;
* ``printer``: the text form (docs/ir.md) of bodies, buffers, graphs and schedules;
* ``graph``: ``LoopGraph``, what ``lower`` produces, and ``collect_deps``;
* ``verify``: the invariants later stages rely on (``verify_graph``, ``verify_schedule``,
  ``IRVerifyError``);
* ``schedule``: ``Schedule``, what ``schedule`` makes of a graph: ``FusedGroup``s and
  ``ExternNode``s in order, with the memory plan (``Allocation``s, frees).

This package re-exports their public names.
"""

from ..analysis import MemoryDep
from .graph import LoopGraph, collect_deps
from .printer import PrintHandler, body_text
from .schedule import Allocation, ExternNode, FusedGroup, SchedNode, Schedule
from .values import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    GenericView,
    InputBuffer,
    IRNode,
    Layout,
    Loops,
    MultiOutput,
    Pointwise,
    Reduction,
    ReinterpretView,
    ScatterBuffer,
    body_indices,
    compute_dtype,
    dtype_str,
)
from .verify import IRVerifyError, verify_graph, verify_schedule

__all__ = [
    "Layout",
    "IRNode",
    "Buffer",
    "InputBuffer",
    "ConstantBuffer",
    "ComputedBuffer",
    "ExternKernel",
    "ScatterBuffer",
    "MultiOutput",
    "ReinterpretView",
    "GenericView",
    "Loops",
    "Pointwise",
    "Reduction",
    "LoopGraph",
    "MemoryDep",
    "collect_deps",
    "SchedNode",
    "FusedGroup",
    "ExternNode",
    "Allocation",
    "Schedule",
    "PrintHandler",
    "dtype_str",
    "compute_dtype",
    "body_text",
    "body_indices",
    "IRVerifyError",
    "verify_graph",
    "verify_schedule",
]
