"""kiln-codegen-cpp: C++/OpenMP kernels for kiln's loop IR (CPU).

- ``CppCodegen``: kiln_loopir's Codegen protocol (one C++ function per fused group).
- ``compile_fx(gm, example_inputs)``: FX graph -> aotgrad -> loopir -> C++ -> runtime.
- ``compile_aten(aten_gm)`` / ``compile_schedule(schedule)``: the later steps alone.
- ``compiler``: the g++ driver (flags, on-disk cache, parallel compiles, ctypes loading).
- ``CODEGEN``: this codegen's ``kiln.codegens`` entry (devices, compile error, how it is built
  from options).
"""

from __future__ import annotations

from kiln_loopir.codegen_registry import CodegenEntry

from .codegen import CppCodegen
from .compiler import CXXFLAGS, CppCompileError, compile_many, compile_source

__all__ = [
    "CODEGEN",
    "CXXFLAGS",
    "CppCodegen",
    "CppCompileError",
    "CppKernel",
    "KilnFallbackWarning",
    "compile_aten",
    "compile_fx",
    "compile_many",
    "compile_schedule",
    "compile_source",
]


def build(options=None) -> CppCodegen:
    """A CppCodegen from an options object (``num_threads``, extra ``cpp_flags``)."""
    extra = tuple(getattr(options, "cpp_flags", ()) or ())
    return CppCodegen(num_threads=getattr(options, "num_threads", None), flags=(*CXXFLAGS, *extra))


#: the ``kiln.codegens`` entry point (see kiln_loopir.codegen_registry)
def toolchain() -> str:
    """The C++ compiler's version (part of graph cache keys)."""
    from .compiler import compiler_version

    return f"cxx {compiler_version()}"


#: the ``kiln.codegens`` entry point (see kiln_loopir.codegen_registry); its kernels return when
#: done, so it declares no synchronize
CODEGEN = CodegenEntry(name="cpp", devices=("cpu",), compile_error=CppCompileError, build=build,
                       priority=10, toolchain=toolchain)


def __getattr__(name):
    # the pipeline imports kiln_aotgrad; load it only when asked for
    if name == "CppKernel":  # sympy's C printer: not needed by a graph-cache hit
        from .kernel import CppKernel

        return CppKernel
    if name in ("compile_fx", "compile_aten", "compile_schedule", "KilnFallbackWarning"):
        from . import pipeline as _m

        return getattr(_m, name)
    raise AttributeError(name)
