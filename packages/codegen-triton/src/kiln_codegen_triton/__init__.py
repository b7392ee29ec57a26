"""kiln-codegen-triton: Triton kernels for kiln's loop IR (CUDA; CPU tensors under
``TRITON_INTERPRET=1``).

- ``TritonCodegen``: kiln_loopir's Codegen protocol (one ``@triton.jit`` kernel per fused group).
- ``TritonCompileError``: a generated kernel did not load or compile.
- ``compile_fx(gm, example_inputs)``: FX graph -> aotgrad -> loopir -> Triton -> runtime.
- ``CODEGEN``: this codegen's ``kiln.codegens`` entry (devices, compile error, how it is built).
"""

from __future__ import annotations

from kiln_loopir.codegen_registry import CodegenEntry

from .codegen import TritonCodegen
from .launcher import TritonCompileError

__all__ = ["CODEGEN", "TritonCodegen", "TritonCompileError", "compile_fx", "compile_aten", "compile_schedule"]


def build(options=None) -> TritonCodegen:
    """A TritonCodegen from an options object (no option applies to it yet)."""
    return TritonCodegen()


#: the ``kiln.codegens`` entry point (see kiln_loopir.codegen_registry). CPU is listed for
#: ``TRITON_INTERPRET=1`` runs; the cpp codegen has the higher priority there.
CODEGEN = CodegenEntry(name="triton", devices=("cuda", "cpu"), compile_error=TritonCompileError,
                       build=build, priority=0)


def __getattr__(name):
    if name in ("compile_fx", "compile_aten", "compile_schedule"):
        from . import pipeline as _m

        return getattr(_m, name)
    raise AttributeError(name)
