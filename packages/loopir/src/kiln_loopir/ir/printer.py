"""The text form of the loop IR (docs/ir.md): loop bodies, buffers, graphs and schedules.

Bodies print by running them under ``PrintHandler``, an ops handler that records each op as a
line. The graph and schedule classes' ``__str__`` call ``graph_text``/``schedule_text``; this
module reads them by their attributes and imports only ``values``, so the phases above it
(graph, schedule) can print without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch

from ..ops_spec import OPS
from ..sizevars import reduction_symbol, sexpr, simplify_index
from ..virtualized import set_ops_handler
from .values import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    ExternKernel,
    Reduction,
    ReinterpretView,
    body_indices,
    dtype_str,
)

# ============================================================================================
# bodies
# ============================================================================================


class PrintHandler:
    """An ops handler that records each op as a line ``tmpN = ops.name(args)``."""

    def __init__(self, var_ranges: dict | None = None, simplify: bool = True):
        self.lines: list[str] = []
        self._n = 0
        self._ind = 0
        self.var_ranges = var_ranges or {}
        self.simplify = simplify

    def _arg(self, a) -> str:
        if isinstance(a, _Val):
            return a.name
        if isinstance(a, sympy.Basic):
            if self.simplify:
                a = simplify_index(a, self.var_ranges)
            return sexpr(a)
        if isinstance(a, torch.dtype):
            return dtype_str(a)
        if isinstance(a, str):
            return a
        return repr(a)

    def _emit(self, name, args, kwargs=None, returns=True):
        parts = [self._arg(a) for a in args]
        for k, v in (kwargs or {}).items():
            if v is not None:
                parts.append(f"{k}={self._arg(v)}")
        call = f"ops.{name}({', '.join(parts)})"
        if not returns:
            self.lines.append(call)
            return None
        v = _Val(f"tmp{self._n}")
        self._n += 1
        self.lines.append(f"{v.name} = {call}")
        return v

    def indirect_indexing(self, x, size, check=True):
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        self.lines.append(f"{sym.name} = ops.indirect_indexing({self._arg(x)}, {self._arg(size)})")
        return sym

    def store(self, name, index, value, mode=None):
        return self._emit("store", (name, index, value), {"mode": mode}, returns=False)

    def store_reduction(self, name, index, value):
        return self._emit("store_reduction", (name, index, value), returns=False)

    def __getattr__(self, name):
        if name not in OPS:
            raise AttributeError(name)

        def op(*args, **kwargs):
            return self._emit(name, args, kwargs)

        return op


class _Val:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


def body_text(fn: Callable, *index_lists, var_ranges: dict | None = None) -> list[str]:
    """Run ``fn(*index_lists)`` under a ``PrintHandler``; return its lines."""
    h = PrintHandler(var_ranges)
    with set_ops_handler(h):
        fn(*index_lists)
    return h.lines


# ============================================================================================
# buffers and extern calls
# ============================================================================================


def op_text(op) -> str:
    """``aten.<name>.<overload>`` for an OpOverload, else the callable's name."""
    name = getattr(op, "_name", None) or getattr(op, "__name__", str(op))
    if name.startswith("aten::"):
        name = name[len("aten::"):]
        ov = getattr(op, "_overloadname", "default")
        base = name.split(".")[0]
        return f"aten.{base}.{ov}"
    return str(name)


def arg_text(a) -> str:
    """An extern call's argument: a buffer by its name, a partial view as ``as_strided``."""
    if isinstance(a, ReinterpretView):
        if a.is_whole():
            return a.data.name
        return (f"as_strided({a.data.name}, [{', '.join(sexpr(s) for s in a.layout.size)}], "
                f"[{', '.join(sexpr(s) for s in a.layout.stride)}], {sexpr(a.layout.offset)})")
    if isinstance(a, Buffer):
        return a.name
    if isinstance(a, sympy.Basic):
        return sexpr(a)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(arg_text(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return str(a)
    return repr(a)


def call_text(kernel: ExternKernel) -> str:
    """``aten.op.overload(args, k=v)``: the call an ExternKernel makes."""
    args = [arg_text(a) for a in kernel.inputs]
    args += [f"{k}={arg_text(v)}" for k, v in kernel.kwargs.items()]
    return f"{op_text(kernel.op)}({', '.join(args)})"


def buffer_text(buf: Buffer, indent: str = "  ") -> list[str]:
    """A buffer's header, then its loop nest and body (ComputedBuffer) or call (ExternKernel)."""
    lines = [buf.header()]
    if isinstance(buf, ComputedBuffer):
        d = buf.data
        if isinstance(d, Reduction):
            lines.append(f"{indent}Reduction {d.reduction_type} ranges "
                         f"[{', '.join(sexpr(r) for r in d.ranges)}] reduction_ranges "
                         f"[{', '.join(sexpr(r) for r in d.reduction_ranges)}]")
        else:
            lines.append(f"{indent}Pointwise ranges [{', '.join(sexpr(r) for r in d.ranges)}]")
        index_lists, var_ranges = body_indices(buf)
        lines += [indent * 2 + b
                  for b in body_text(buf.store_body(), *index_lists, var_ranges=var_ranges)]
    elif isinstance(buf, ExternKernel):
        lines.append(f"{indent}{call_text(buf)}")
    elif isinstance(buf, ConstantBuffer):
        lines[0] += buf.comment()
    return lines


def return_text(outputs) -> str:
    """The text form's last line: the graph's outputs (a whole-buffer view by its name)."""
    outs = [o.data.name if isinstance(o, ReinterpretView) and o.is_whole() else arg_text(o)
            for o in outputs]
    return f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})"


def _sizevars_line(sizevars: dict) -> list[str]:
    if not sizevars:
        return []
    return ["sizevars: " + ", ".join(
        f"{s}={src!r}" for s, src in sorted(sizevars.items(), key=lambda kv: kv[0].name))]


# ============================================================================================
# the graph (a LoopGraph)
# ============================================================================================


def graph_text(graph) -> str:
    """A ``LoopGraph``: inputs, constants, every buffer with its body, the outputs."""
    lines = [f"LoopGraph device={graph.device}", *_sizevars_line(graph.sizevars)]
    for b in graph.inputs:
        lines.append(b.header())
    for b in graph.constant_buffers:
        lines += buffer_text(b)
    for b in graph.buffers:
        lines += buffer_text(b)
    lines.append(return_text(graph.outputs))
    return "\n".join(lines)


# ============================================================================================
# the schedule (a Schedule of FusedGroups and ExternNodes)
# ============================================================================================


def sched_node_text(node, outer_syms, indent: str = "  ") -> list[str]:
    """A ``SchedNode``: kind, inner ranges, reduction type, then its body over
    (``outer_syms``, ``r*``)."""
    inner_syms = [reduction_symbol(k) for k in range(len(node.inner))]
    head = f"{node.buffer.name}: {node.kind}"
    if node.inner:
        head += f" inner [{', '.join(sexpr(r) for r in node.inner)}]"
    if node.kind == "reduction":
        head += f" {node.reduction_type}"
    lines = [head]
    lines += [indent + ln for ln in body_text(node.body, outer_syms, inner_syms)]
    return lines


def _with_frees(step, lines: list[str], indent: str) -> list[str]:
    if step.frees:
        lines.append(indent + "free: " + ", ".join(step.frees))
    return lines


def group_text(group, indent: str = "  ") -> list[str]:
    """A ``FusedGroup``: outer ranges, allocations, nodes, internal buffers, frees."""
    lines = [f"{group.name}: FusedGroup outer [{', '.join(sexpr(o) for o in group.outer)}]"]
    for a in group.allocations:
        lines.append(indent + str(a))
    for n in group.nodes:
        lines += [indent + ln for ln in sched_node_text(n, group.outer_symbols, indent)]
    if group.internal_buffers:
        lines.append(indent + "internal: " + ", ".join(sorted(group.internal_buffers)))
    return _with_frees(group, lines, indent)


def extern_text(step, indent: str = "  ") -> list[str]:
    """An ``ExternNode``: its kernel's call, the MultiOutputs it binds, frees."""
    lines = buffer_text(step.kernel, indent)
    for m in step.kernel.outputs:
        lines.append(indent + m.header())
    return _with_frees(step, lines, indent)


def schedule_text(schedule) -> str:
    """A ``Schedule``: inputs, constants, each step in order, the outputs."""
    g = schedule.graph
    lines = [f"Schedule device={g.device}", *_sizevars_line(g.sizevars)]
    for b in g.inputs:
        lines.append(b.header())
    for b in g.constant_buffers:
        lines.append(b.header() + b.comment())
    for s in schedule.steps:
        lines += s.text()
    lines.append(return_text(g.outputs))
    return "\n".join(lines)
