"""kiln-codegen-cpp: C++/OpenMP kernels for kiln's loop IR (CPU).

- ``CppCodegen``: kiln_loopir's Codegen protocol (one C++ function per fused group).
- ``compile_fx(gm, example_inputs)``: FX graph -> aotgrad -> loopir -> C++ -> runtime.
- ``compile_aten(aten_gm)`` / ``compile_schedule(schedule)``: the later steps alone.
- ``compiler``: the g++ driver (flags, on-disk cache, parallel compiles, ctypes loading).
"""

from __future__ import annotations

from .codegen import CppCodegen
from .compiler import CXXFLAGS, CppCompileError, compile_many, compile_source
from .kernel import CppKernel

__all__ = [
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


def __getattr__(name):
    # the pipeline imports kiln_aotgrad; load it only when asked for
    if name in ("compile_fx", "compile_aten", "compile_schedule", "KilnFallbackWarning"):
        from . import pipeline as _m

        return getattr(_m, name)
    raise AttributeError(name)
