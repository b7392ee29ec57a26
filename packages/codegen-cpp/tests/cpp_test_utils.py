"""Hand-built LoopGraphs and Schedules for testing the C++ codegen without the lowering and
the scheduler (those are tested end to end in test_pipeline.py)."""

from __future__ import annotations

import importlib.util

import kiln_runtime
import sympy
import torch
from kiln_codegen_cpp import CppCodegen
from kiln_loopir.ir import (
    Allocation,
    ComputedBuffer,
    FusedGroup,
    InputBuffer,
    Layout,
    LoopGraph,
    Pointwise,
    Reduction,
    ReinterpretView,
    SchedNode,
    Schedule,
)
from kiln_loopir.sizevars import SizeVarSource, size_symbol
from kiln_loopir.virtualized import ops
from kiln_loopir.wrapper import generate_wrapper


class G:
    """A LoopGraph under construction.

    ``G(x, y, dynamic=True)``: inputs ``arg0, arg1`` with the layouts of the example tensors;
    with ``dynamic`` every dim of size > 1 is a symbol (equal sizes share a symbol)."""

    def __init__(self, *examples: torch.Tensor, dynamic: bool = False):
        self.graph = LoopGraph()
        self.graph.num_placeholders = len(examples)
        self.sym_of_size: dict[int, sympy.Symbol] = {}
        self.inputs = []
        for pos, t in enumerate(examples):
            size = []
            for d, n in enumerate(t.shape):
                if dynamic and n > 1:
                    if n not in self.sym_of_size:
                        s = size_symbol(len(self.sym_of_size))
                        self.sym_of_size[n] = s
                        self.graph.sizevars[s] = SizeVarSource(pos, d)
                    size.append(self.sym_of_size[n])
                else:
                    size.append(sympy.Integer(n))
            if dynamic:
                assert t.is_contiguous(), "dynamic test inputs must be contiguous"
                lay = Layout.contiguous("cpu", t.dtype, size)
            else:
                lay = Layout("cpu", t.dtype, size, t.stride())
            self.inputs.append(self.graph.add_input(InputBuffer(f"arg{pos}", lay, pos)))
        self.groups: list[list[tuple[ComputedBuffer, list]]] = []

    def size(self, n: int):
        return self.sym_of_size.get(n, sympy.Integer(n))

    def load(self, k: int, index: list):
        b = self.inputs[k]
        return ops.load(b.name, b.layout.index(index))

    def loader(self, buf):
        return lambda index: ops.load(buf.name, buf.layout.index(index))

    def pointwise(self, ranges, fn, dtype, layout: Layout | None = None) -> ComputedBuffer:
        lay = layout or Layout.contiguous("cpu", dtype, ranges)
        buf = ComputedBuffer(self.graph.new_name(), lay, Pointwise("cpu", dtype, ranges, fn))
        return self.graph.register_buffer(buf)

    def reduction(self, ranges, rranges, rtype, fn, dtype, src_dtype=None) -> ComputedBuffer:
        lay = Layout.contiguous("cpu", dtype, ranges)
        red = Reduction("cpu", dtype, src_dtype or dtype, ranges, rranges, rtype, fn)
        buf = ComputedBuffer(self.graph.new_name(), lay, red)
        return self.graph.register_buffer(buf)

    def schedule(self, outputs, groups=None, internal=()) -> Schedule:
        """One group per buffer, or ``groups``: lists of buffers fused into one group whose
        outer ranges are the first node's ``ranges`` (pointwise nodes then loop over their
        remaining dims as inner ranges)."""
        g = self.graph
        g.outputs = [ReinterpretView(b, b.layout) for b in outputs]
        computed = [b for b in g.buffers if isinstance(b, ComputedBuffer)]
        if groups is None:
            groups = [[b] for b in computed]
        steps = []
        for k, members in enumerate(groups):
            outer = list(members[0].data.ranges)
            nodes = []
            for b in members:
                nodes.append(_sched_node(b, len(outer)))
            allocs = [Allocation(b.name, b.layout, internal=b.name in internal) for b in members]
            steps.append(FusedGroup(f"group{k}", outer, nodes,
                                    internal_buffers={b.name for b in members if b.name in internal},
                                    allocations=allocs))
        return Schedule(g, steps)


def _sched_node(b: ComputedBuffer, n_outer: int) -> SchedNode:
    body = b.store_body()
    if b.is_reduction():
        return SchedNode(b, "reduction", list(b.data.reduction_ranges),
                         lambda outer, inner: body(list(outer), list(inner)))
    inner = list(b.data.ranges[n_outer:])
    return SchedNode(b, "pointwise", inner, lambda outer, inner: body(list(outer) + list(inner)))


def compile_sched(sched: Schedule):
    module = generate_wrapper(sched, CppCodegen())
    fn = kiln_runtime.load(module)
    fn.module = module
    return fn


def has_interpreter() -> bool:
    return importlib.util.find_spec("kiln_loopir.interpreter") is not None


def check(sched: Schedule, inputs, expected, **tol):
    """Compile ``sched``; compare its outputs with ``expected`` (eager) and with the loopir
    interpreter. Returns the compiled callable."""
    fn = compile_sched(sched)
    got = fn(*inputs)
    for g_, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g_, e, **tol)
    if has_interpreter():
        import kiln_loopir

        ref = kiln_loopir.interpret(sched)(*inputs)
        for g_, r in zip(got, ref, strict=True):
            torch.testing.assert_close(g_, r, **tol)
    return fn


def check_compile_fx(fn, x) -> None:
    """``fn(x)`` through the whole pipeline (``compile_fx``: aotgrad -> loopir -> C++) under
    no_grad equals eager, output by output (a tensor or a tuple of them)."""
    from kiln_codegen_cpp import compile_fx

    gm = torch.fx.symbolic_trace(lambda t: fn(t))
    with torch.no_grad():
        got = compile_fx(gm, [x])(x)
    want = fn(x)
    want = list(want) if isinstance(want, tuple) else [want]
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
