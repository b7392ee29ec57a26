"""The protocol a codegen implements, and what the wrapper generator produces.

A codegen turns each ``FusedGroup`` of a ``Schedule`` into a kernel and tells the wrapper
generator (``kiln_loopir.wrapper.generate_wrapper``) how to call kernels and extern ops. Adding
a codegen never touches loopir: implement ``Codegen`` and pass it to ``generate_wrapper``.

The generated wrapper is Python source defining ``call(*args) -> list[Tensor]`` (args: the
graph's placeholders in order). ``kiln_runtime.load(module)`` execs ``module.wrapper_source``
in ``module.build_namespace()`` (kernels' loaded callables + graph constants + helpers) and
returns the ``call`` function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .ir.schedule import ExternNode, FusedGroup, Schedule
from .sizevars import pexpr

__all__ = ["Codegen", "KernelDef", "KernelLaunch", "GeneratedModule"]


@dataclass
class KernelLaunch:
    """How the wrapper calls one kernel: ``derived`` sizes first (``xnumel = s0*s1``: name ->
    SymPy expression over size symbols), then ``kernel(*args)``; ``args`` are wrapper
    expressions (buffer names, ``buf0.data_ptr()``, size names). ``grid``: how the launcher
    covers the iteration space, for people reading the wrapper (a comment)."""

    kernel: str
    args: list[str]
    derived: dict[str, Any] = field(default_factory=dict)
    grid: str = ""

    def python(self) -> str:
        lines = [f"{name} = {pexpr(e)}" for name, e in self.derived.items()]
        call = f"{self.kernel}({', '.join(self.args)})"
        lines.append(call + (f"  # grid: {self.grid}" if self.grid else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.python()


@dataclass
class KernelDef:
    """One generated kernel.

    ``name``: the Python name the wrapper calls it by; ``source``: its source text (C++,
    Triton, ...); ``arg_names``: what the wrapper passes, in order: buffer names (inputs,
    outputs; ``Schedule`` names) and size symbols (``"s0"``), ``group``: the FusedGroup it
    implements; ``launch``: the typed call the wrapper writes (when None, the wrapper asks
    ``codegen.kernel_call``); ``plan``: loopir's KernelPlan of the group; ``meta``: anything
    else the codegen wants to keep (compile flags, ...).
    """

    name: str
    source: str
    arg_names: list[str]
    group: FusedGroup | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    launch: KernelLaunch | None = None
    plan: Any = None


@runtime_checkable
class Codegen(Protocol):
    name: str  # "cpp", "triton", ...

    def define_kernel(self, group: FusedGroup, sched: Schedule) -> KernelDef:
        """Source for one fused group (implements every op of ops_spec it meets or raises
        MissingOpError naming the op)."""
        ...

    def kernel_call(self, kernel: KernelDef) -> str:
        """One Python wrapper line calling the kernel, e.g. ``"kernel_0(buf0, arg1, s0)"``."""
        ...

    def extern_call(self, node: ExternNode) -> str:
        """Python line(s) computing ``node.name`` (and its MultiOutputs) with the aten op."""
        ...

    # optional: ``wrapper_prelude(device) -> str``: lines at the top of ``call`` for a device
    # (stream, device guard); ``standalone_source(kernels) -> str``: Python that compiles
    # and binds the kernels by name in a standalone output_code.py.

    def finalize(self, kernels: list[KernelDef]) -> dict[str, Callable]:
        """Compile/load all kernels (in parallel where possible); return ``{kernel name:
        callable}`` for the wrapper's namespace."""
        ...


@dataclass
class GeneratedModule:
    """Everything ``kiln_runtime.load`` needs: plain data plus a namespace builder.

    ``wrapper_source``: Python source defining ``entry`` (default ``call``);
    ``kernels``: the KernelDefs (their sources are what a debug dump shows);
    ``namespace_builder``: called once by the runtime; returns the dict the wrapper source is
    exec'ed in (typically ``codegen.finalize(kernels)`` + ``constants`` + imports the wrapper
    needs); ``constants``: graph tensor constants by buffer name; ``codegen``: its ``name``;
    ``cache_key``: a stable key of wrapper + kernels sources (for on-disk caches), may be "";
    ``synchronize``: the codegen entry's device wait (the profiler's clock calls it), or None.
    """

    wrapper_source: str
    kernels: list[KernelDef]
    namespace_builder: Callable[[], dict] | None = None
    constants: dict[str, Any] = field(default_factory=dict)
    codegen: str = ""
    entry: str = "call"
    cache_key: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    synchronize: Callable[[], None] | None = None

    def build_namespace(self) -> dict:
        ns: dict = {}
        if self.namespace_builder is not None:
            ns.update(self.namespace_builder())
        for k, v in self.constants.items():
            ns.setdefault(k, v)
        return ns
