"""The generic Python wrapper generator: ``generate_wrapper(schedule, codegen) -> GeneratedModule``.

The wrapper is the Python function that runs a compiled graph::

    def call(args):
        arg0, arg1 = args
        args.clear()
        s0 = arg0.size(0)
        buf0 = empty_strided_cpu((s0,), (1,), torch.float32)
        cpp_kernel_0(buf0.data_ptr(), arg0.data_ptr(), arg1.data_ptr(), s0)
        return [buf0]

It uses, without importing them, the launch helpers that ``kiln_runtime.load`` puts in its
namespace (``LAUNCH_HELPERS``: ``empty_strided_cpu``, ``reinterpret_tensor``, ...), so loopir
itself never depends on the runtime. It unpacks the inputs, reads each dynamic size once from an input's shape, allocates buffers
as the schedule's memory plan says (``empty_strided``; a buffer that takes over a freed one's
storage is a ``reinterpret_tensor`` of it), runs kernels and extern (aten) calls in schedule
order, ``del``s every buffer after its last use, and returns the outputs (views with their own
size/stride/offset where an output is a view of a buffer). It checks nothing: guards ran
before it. Internal buffers a kernel keeps in registers are never allocated.

Codegen-independent: the codegen supplies kernel definitions, call lines and extern lines
(``extern_call_source`` below is the generic aten call every codegen may use).
``module.meta["output_code"]`` is a standalone ``output_code.py`` (wrapper + kernels + a
benchmark on random inputs when run as a script).
"""

from __future__ import annotations

import contextvars
import hashlib
import math
from typing import Any

import sympy
import torch

from .codegen_protocol import GeneratedModule, KernelDef
from .codegen_registry import CodegenUnavailable, get_codegen
from .ir.schedule import ExternNode, FusedGroup, Schedule
from .ir.values import Buffer, ConstantBuffer, Layout, ReinterpretView
from .sizevars import pexpr

__all__ = ["generate_wrapper", "extern_call_source", "py_arg", "output_code"]

INDENT = "    "
CONSTANT_VIEWS_HEADER = "# views of graph constants, made once when the wrapper is loaded"
#: free names a wrapper may use: the runtime's launch helpers (kiln_runtime.launch.HELPERS)
LAUNCH_HELPERS = ("empty_strided", "empty_strided_cpu", "empty_strided_cuda", "reinterpret_tensor", "aten_direct")


# =============================================================================================
# Python text of values
# =============================================================================================


def _tuple_text(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _sizes_text(exprs) -> str:
    return _tuple_text([pexpr(e) for e in exprs]) if len(exprs) else "()"


def _dtype_text(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32"


def op_reference(op) -> str:
    """Python text reaching an OpOverload: ``aten.mm.default`` / ``torch.ops.ns.op.overload``."""
    schema_name = op._schema.name  # "aten::mm"
    ns, name = schema_name.split("::", 1)
    overload = op._overloadname or "default"
    head = "aten" if ns == "aten" else f"torch.ops.{ns}"
    return f"{head}.{name}.{overload}"


#: while a wrapper is written: view text -> the name it is bound to once, at load (views of
#: graph constants: a transposed weight under ``mm`` is the same view at every call)
_constant_views: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "kiln_constant_views", default=None)


def _static(exprs) -> bool:
    return all(sympy.sympify(e).is_number for e in exprs)


def py_arg(a: Any) -> str:
    """Python source of an extern kernel argument (buffers by name, views as
    ``reinterpret_tensor``, SymPy sizes as Python arithmetic, torch enums by name). Inside
    ``generate_wrapper``, a static view of a graph constant is a name bound once at load."""
    if isinstance(a, ReinterpretView):
        if a.is_whole():
            return a.data.name
        lay = a.layout
        text = (f"reinterpret_tensor({a.data.name}, {_sizes_text(lay.size)}, "
                f"{_sizes_text(lay.stride)}, {pexpr(lay.offset)})")
        hoisted = _constant_views.get()
        if (hoisted is not None and isinstance(a.data, ConstantBuffer)
                and _static([*lay.size, *lay.stride, lay.offset])):
            if text not in hoisted:
                hoisted[text] = f"{a.data.name}_view{len(hoisted)}"
            return hoisted[text]
        return text
    if isinstance(a, Buffer):
        return a.name
    if isinstance(a, sympy.Basic):
        return pexpr(a)
    if isinstance(a, bool) or a is None:
        return repr(a)
    if isinstance(a, float):
        if math.isnan(a):
            return "float('nan')"
        if math.isinf(a):
            return "float('inf')" if a > 0 else "float('-inf')"
        return repr(a)
    if isinstance(a, (int, str)):
        return repr(a)
    if isinstance(a, torch.dtype):
        return _dtype_text(a)
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, (torch.layout, torch.memory_format)):
        return str(a)  # torch.strided, torch.contiguous_format
    if isinstance(a, list):
        return "[" + ", ".join(py_arg(x) for x in a) + "]"
    if isinstance(a, tuple):
        return _tuple_text([py_arg(x) for x in a]) if a else "()"
    raise TypeError(f"cannot write extern argument {a!r} ({type(a).__name__}) as Python")


def extern_call_source(node: ExternNode) -> str:
    """``buf3 = aten.mm.default(buf1, buf2)`` (+ one line per MultiOutput)."""
    k = node.kernel
    args = [py_arg(a) for a in k.inputs] + [f"{key}={py_arg(v)}" for key, v in k.kwargs.items()]
    lines = [f"{k.name} = {op_reference(k.op)}({', '.join(args)})"]
    for m in k.outputs:
        lines.append(f"{m.name} = {k.name}[{m.index}]")
    return "\n".join(lines)


def _alloc_text(name: str, layout: Layout) -> str:
    if layout.offset != 0:
        raise NotImplementedError(f"allocation of {name} with a storage offset ({layout})")
    size, stride, dtype = _sizes_text(layout.size), _sizes_text(layout.stride), _dtype_text(layout.dtype)
    dev = layout.device
    if dev.type in ("cpu", "cuda") and (dev.type == "cpu" or dev.index is None):
        return f"{name} = empty_strided_{dev.type}({size}, {stride}, {dtype})"
    return f"{name} = empty_strided({size}, {stride}, {dtype}, torch.device({str(dev)!r}))"


# =============================================================================================
# the generator
# =============================================================================================


class _WrapperWriter:
    def __init__(self, sched: Schedule, codegen):
        self.sched = sched
        self.graph = sched.graph
        self.codegen = codegen
        self.lines: list[str] = []
        self.kernels: list[KernelDef] = []
        self.live: set[str] = set()  # names bound in the wrapper right now
        self.never_free = {b.name for b in self.graph.inputs} | set(self.graph.constants)
        self.never_free |= set(self.graph.output_names())
        # buffers whose storage a later allocation takes over: not deleted at their last use
        self.reused_later = {a.reuses for s in sched.steps for a in s.allocations
                             if a.reuses and not a.in_place}

    def emit(self, text: str) -> None:
        for ln in text.splitlines():
            self.lines.append(INDENT + ln if ln else "")

    def arg_names(self) -> list[str]:
        """Wrapper names of the placeholders, in order (tensor inputs by buffer name)."""
        n = getattr(self.graph, "num_placeholders", 0) or len(self.graph.inputs)
        names = [f"arg{p}" for p in range(n)]
        for b in self.graph.inputs:
            if b.position < n:
                names[b.position] = b.name
        return names

    def write(self) -> str:
        args = self.arg_names()
        hoisted: dict[str, str] = {}
        token = _constant_views.set(hoisted)
        try:
            self.emit_header(args)
            for step in self.sched.steps:
                self.emit_step(step)
        finally:
            _constant_views.reset(token)
        self.emit(f"return [{', '.join(self.output_text(o) for o in self.graph.outputs)}]")
        head = [
            "import torch",
            "",
            "aten = aten_direct  # torch.ops.aten, called without OpOverload.__call__ (kiln_runtime.launch)",
            "",
            "",
            "def call(args):",
        ]
        self.constant_views = ""
        if hoisted:  # bound when the wrapper loads: the constants are in its namespace then
            self.constant_views = "\n".join(
                [CONSTANT_VIEWS_HEADER] + [f"{name} = {text}" for text, name in hoisted.items()]) + "\n"
        return "\n".join(head + self.lines) + "\n" + (
            "\n\n" + self.constant_views if self.constant_views else "")

    def emit_header(self, args: list[str]) -> None:
        if args:
            self.emit(f"{', '.join(args)}{',' if len(args) == 1 else ''} = args")
            self.emit("args.clear()")
        self.live.update(args)
        prelude = getattr(self.codegen, "wrapper_prelude", None)
        if prelude is not None:
            text = prelude(self.graph.device)
            if text:
                self.emit(text)
        for sym in sorted(self.graph.sizevars, key=lambda s: int(s.name[1:])):
            src = self.graph.sizevars[sym]
            if getattr(src, "buffer", None) is None:
                self.emit(f"{sym.name} = {src.python(args)}")

    def emit_step(self, step) -> None:
        if isinstance(step, FusedGroup):
            kernel = self.codegen.define_kernel(step, self.sched)
            self.kernels.append(kernel)
            needed = set(kernel.arg_names)
            for a in step.allocations:
                if a.internal and a.name not in needed:
                    continue  # the kernel keeps it in registers
                self.emit_allocation(a)
            if kernel.launch is not None:
                self.emit(kernel.launch.python())
            else:
                self.emit(self.codegen.kernel_call(kernel))
        elif isinstance(step, ExternNode):
            for a in step.allocations:
                self.emit_allocation(a)
            self.emit(self.codegen.extern_call(step))
            self.live.add(step.name)
            self.live.update(m.name for m in step.outputs)
            if step.outputs and step.name not in self.never_free:
                self.emit(f"del {step.name}")  # the tuple; its MultiOutputs stay bound
                self.live.discard(step.name)
            # sizes that only this extern's result knows (data-dependent shapes)
            for sym in sorted(self.graph.sizevars, key=lambda s: int(s.name[1:])):
                src = self.graph.sizevars[sym]
                if getattr(src, "buffer", None) in self.live and getattr(src, "buffer", None) in step.writes:
                    self.emit(f"{sym.name} = {src.python(self.arg_names())}")
        else:
            raise TypeError(f"unknown schedule step {step!r}")
        dead = [n for n in step.frees
                if n in self.live and n not in self.never_free and n not in self.reused_later]
        if dead:
            self.emit(f"del {', '.join(dead)}")
            self.live.difference_update(dead)

    def emit_allocation(self, a) -> None:
        if a.reuses:
            if a.reuses not in self.live:  # the scheduler never lends an internal buffer
                raise ValueError(f"memory plan: {a.name} reuses {a.reuses}, which has no storage here")
            old = self.graph.get_buffer(a.reuses).layout
            # in place: the step still reads the old name; it is deleted after the step
            tail = "  # in place" if a.in_place else f"; del {a.reuses}  # reuse"
            if (old.size, old.stride) == (a.layout.size, a.layout.stride):
                self.emit(f"{a.name} = {a.reuses}{tail}")
            else:
                self.emit(f"{a.name} = reinterpret_tensor({a.reuses}, {_sizes_text(a.layout.size)}, "
                          f"{_sizes_text(a.layout.stride)}){tail}")
            if not a.in_place:
                self.live.discard(a.reuses)
        else:
            self.emit(_alloc_text(a.name, a.layout))
        self.live.add(a.name)

    def output_text(self, o) -> str:
        if isinstance(o, ReinterpretView):
            if o.is_whole():
                return o.data.name
            lay = o.layout
            return (f"reinterpret_tensor({o.data.name}, {_sizes_text(lay.size)}, "
                    f"{_sizes_text(lay.stride)}, {pexpr(lay.offset)})")
        if isinstance(o, Buffer):
            return o.name
        return py_arg(o)


def _synchronize_of(codegen_name: str):
    """The registered codegen's device wait; a codegen built outside the registry has none."""
    try:
        return get_codegen(codegen_name).synchronize
    except (ValueError, CodegenUnavailable):
        return None


def generate_wrapper(sched: Schedule, codegen) -> GeneratedModule:
    """Python wrapper source + kernel definitions for ``sched`` (see the module docstring)."""
    writer = _WrapperWriter(sched, codegen)
    source = writer.write()
    kernels = writer.kernels
    key = hashlib.sha256(
        "\0".join([codegen.name, source] + [k.source for k in kernels]).encode()
    ).hexdigest()
    module = GeneratedModule(
        wrapper_source=source,
        kernels=kernels,
        namespace_builder=lambda: codegen.finalize(kernels),
        constants=dict(sched.graph.constants),
        codegen=codegen.name,
        cache_key=key,
        synchronize=_synchronize_of(codegen.name),
    )
    module.meta["schedule"] = sched
    module.meta["constant_views"] = writer.constant_views
    module.meta["output_code"] = output_code(module, sched, codegen)
    return module


# =============================================================================================
# output_code.py
# =============================================================================================

DEFAULT_SIZE_HINT = 8


def _size_hints(graph) -> dict:
    hints = getattr(graph, "size_hints", None) or graph.meta.get("size_hints") or {}
    return {str(k): int(v) for k, v in hints.items()}


def _concrete(expr, hints: dict) -> int:
    expr = sympy.sympify(expr)
    subs = {s: hints.get(s.name, DEFAULT_SIZE_HINT) for s in expr.free_symbols}
    return int(expr.subs(subs))


def _random_tensor_text(layout: Layout, hints: dict) -> str:
    size = tuple(_concrete(s, hints) for s in layout.size)
    stride = tuple(_concrete(s, hints) for s in layout.stride)
    dt = layout.dtype
    base = f"torch.empty_strided({size}, {stride}, dtype={_dtype_text(dt)}, device={str(layout.device)!r})"
    if dt == torch.bool:
        return f"{base}.random_(0, 2)"
    if dt.is_floating_point:
        return f"{base}.normal_()"
    if dt.is_complex:
        return f"{base}.normal_()"
    return f"{base}.random_(-8, 8)" if dt.is_signed else f"{base}.random_(0, 16)"


def output_code(module: GeneratedModule, sched: Schedule, codegen) -> str:
    """A standalone ``output_code.py``: the wrapper, the kernels (compiled on import through
    the codegen's ``standalone_source``), and a ``__main__`` benchmark on random inputs.
    Graph constants are random tensors of the right layout in this file."""
    graph = sched.graph
    hints = _size_hints(graph)
    views = module.meta.get("constant_views", "")
    parts = [
        f"# kiln output_code.py (codegen: {codegen.name}). Run `python output_code.py` to benchmark\n"
        "# the compiled graph on random inputs (sizes: the compile-time hints).\n"
        f"from kiln_runtime.launch import {', '.join(LAUNCH_HELPERS)}",
        module.wrapper_source.replace(views, "") if views else module.wrapper_source,
    ]
    standalone = getattr(codegen, "standalone_source", None)
    if module.kernels:
        if standalone is None:
            parts.append(f"raise NotImplementedError('codegen {codegen.name} cannot write standalone kernels')")
        else:
            parts.append(f"# ---- kernels ({codegen.name}) " + "-" * 60)
            parts.append(standalone(module.kernels))
    if graph.constants:
        lines = [
            "# ---- graph constants: constants.pt beside this file (KILN_COMPILE_DEBUG writes it),",
            "# else random values of the right layout ----",
            "import os as _os",
            "_constants = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), 'constants.pt')",
            "if _os.path.exists(_constants):",
            "    globals().update(torch.load(_constants, weights_only=False))",
            "else:",
        ]
        lines += [f"    {b.name} = {_random_tensor_text(b.layout, hints)}"
                  for b in graph.constant_buffers if b.recipe is None]
        derived = [b for b in graph.constant_buffers if b.recipe is not None]
        if derived:  # made again from their sources (opaque ones, a packed weight, are not saved)
            lines.append("from kiln_loopir.derived_constants import derive")
            lines += [f"{b.name} = derive({b.recipe[0]!r}, {', '.join([b.recipe[1], *map(repr, b.recipe[2])])})"
                      for b in derived]
        parts.append("\n".join(lines))
    if views:  # after the constants they view
        parts.append(views)
    n = getattr(graph, "num_placeholders", 0) or len(graph.inputs)
    by_pos = {b.position: b for b in graph.inputs}
    inputs = []
    for p in range(n):
        b = by_pos.get(p)
        if b is None:  # an integer placeholder (a SymInt)
            inputs.append(str(DEFAULT_SIZE_HINT))
        else:
            inputs.append(_random_tensor_text(b.layout, hints))
    main = [
        "",
        "def make_inputs():",
        f"    return [{', '.join(inputs)}]",
        "",
        "",
        "def benchmark(repeat=100):",
        "    import time",
        "    inputs = make_inputs()",
        "    for _ in range(3):",
        "        call(list(inputs))",
        "    t0 = time.perf_counter()",
        "    for _ in range(repeat):",
        "        call(list(inputs))",
        "    return (time.perf_counter() - t0) / repeat",
        "",
        "",
        'if __name__ == "__main__":',
        "    for _i, _out in enumerate(call(make_inputs())):",
        "        print(_i, tuple(_out.shape), _out.dtype, _out.device)",
        '    print(f"{benchmark() * 1e3:.4f} ms per call")',
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n" + "\n".join(main) + "\n"
