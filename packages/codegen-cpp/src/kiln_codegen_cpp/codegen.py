"""``CppCodegen``: kiln_loopir's Codegen protocol for CPU (C++/OpenMP kernels)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from kiln_loopir.codegen_protocol import KernelDef
from kiln_loopir.ir import ExternNode, FusedGroup, InputBuffer, Schedule
from kiln_loopir.kernel_plan import split_inner_ranges
from kiln_loopir.sizevars import pexpr

from .compiler import CXXFLAGS, compile_many, kernel_function
from .prelude import prelude

#: the C symbol of every kernel: sources differ only where kernels differ, so identical
#: kernels (a model's repeated layers) share one cache entry and one compile.
C_SYMBOL = "kiln_kernel"
#: split rows read through ``r // c`` and ``r % c`` into nested loops (``split_inner_ranges``);
#: False for A/B runs
SPLIT_INNER_RANGES = True


class CppCodegen:
    """One C++ function per FusedGroup; aten calls for ExternNodes.

    ``num_threads``: OpenMP threads per kernel (default ``torch.get_num_threads()`` when the
    kernels are loaded)."""

    name = "cpp"

    def __init__(self, num_threads: int | None = None, flags: tuple[str, ...] = CXXFLAGS):
        self.num_threads = num_threads
        self.flags = tuple(flags)
        self._count = 0

    # -- protocol ---------------------------------------------------------------------------
    def define_kernel(self, group: FusedGroup, sched: Schedule) -> KernelDef:
        graph = sched.graph
        dtypes = {name: buf.layout.dtype for name, buf in graph.name_to_buffer.items()
                  if getattr(buf, "layout", None) is not None}
        inputs = {b.name for b in graph.inputs if isinstance(b, InputBuffer)}
        written_inputs = {d.name for d in getattr(group, "writes", ()) if d.name in inputs}
        from .kernel import CppKernel  # lazy: a graph-cache hit only finalizes kernels

        # a buffer written over its input in place (Allocation.in_place): both pointers alias
        in_place = {n for a in getattr(group, "allocations", ()) if a.in_place for n in (a.name, a.reuses)}
        # rows read through r // c and r % c loop over their parts (Swin's patch merging)
        split = split_inner_ranges(group) if SPLIT_INNER_RANGES else group
        kernel = CppKernel(split, C_SYMBOL, dtypes, written_inputs, in_place)
        body = kernel.generate()
        name = f"cpp_kernel_{self._count}"
        self._count += 1
        buffers = kernel.arg_buffers()
        return KernelDef(
            name=name,
            source=prelude() + "\n" + body,
            arg_names=kernel.arg_names(),
            group=group,
            meta={
                "buffers": buffers,
                "sizes": [s.name for s in kernel.arg_sizes()] + list(kernel.derived),
                "derived": {name: pexpr(e) for name, e in kernel.derived.items()},
                "c_names": [kernel.cname[b] for b in buffers],
                "body": body,
                "loads": kernel.stats["loads"],
                "stores": kernel.stats["stores"],
                "locals": sorted(kernel.local_buffers),
            },
        )

    def kernel_call(self, kernel: KernelDef) -> str:
        """``xnumel = s0*s1`` (derived sizes, when the kernel takes any) then the call."""
        lines = [f"{name} = {expr}" for name, expr in kernel.meta.get("derived", {}).items()]
        args = [f"{b}.data_ptr()" for b in kernel.meta["buffers"]] + list(kernel.meta["sizes"])
        lines.append(f"{kernel.name}({', '.join(args)})")
        return "\n".join(lines)

    def extern_call(self, node: ExternNode) -> str:
        from kiln_loopir.wrapper import extern_call_source

        return extern_call_source(node)

    def finalize(self, kernels: list[KernelDef]) -> dict[str, Callable]:
        """Compile every kernel (in parallel, cached) and return name -> ctypes function."""
        paths = compile_many({k.name: k.source for k in kernels}, self.flags)
        threads = self.num_threads or torch.get_num_threads()
        out = {}
        for k in kernels:
            argtypes = [ctypes.c_void_p] * len(k.meta["buffers"]) + [ctypes.c_int64] * len(k.meta["sizes"])
            out[k.name] = kernel_function(paths[k.name], C_SYMBOL, argtypes, threads)
        return out

    # -- for output_code.py -----------------------------------------------------------------
    def standalone_source(self, kernels: list[KernelDef]) -> str:
        """Python source that compiles and binds the kernels by name (for output_code.py)."""
        lines = ["from kiln_codegen_cpp.standalone import load_kernels", "", "_cpp_kernels = {"]
        for k in kernels:
            lines.append(f"    {k.name!r}: ({len(k.meta['buffers'])}, {len(k.meta['sizes'])}, r'''")
            lines.append(k.source.rstrip("\n"))
            lines.append("'''),")
        lines.append("}")
        lines.append("globals().update(load_kernels(_cpp_kernels))")
        return "\n".join(lines) + "\n"
