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


#: a graph of at least this many FX nodes starts the compile workers before it is traced.
#: Workers import triton only (compile_workers.captured_compile): 8 were up 0.34 s after the
#: start on the H200's host, where importing torch in each had taken 4 s and slowed the
#: tracing (so this was 400 nodes, which resnet50 is below). resnet50's first cold compile:
#: 8.4 s with torch-importing workers started at its kernel compiles, 6.0 s now.
PREPARE_MIN_NODES = 100


def prepare(graph_nodes: int) -> None:
    """Start the compile-worker processes (``compile_workers``) for a model-sized CUDA graph,
    and warm this process's own Triton state (``warm_up_parent``), so that both overlap the
    graph's tracing and lowering instead of its kernel compiles."""
    from . import compile_workers
    from .launcher import _interpreting

    if graph_nodes >= PREPARE_MIN_NODES and not _interpreting():
        import torch

        if torch.cuda.is_available():
            compile_workers.start()
            compile_workers.warm_up_parent()


def toolchain() -> str:
    """Triton's and CUDA's versions (part of graph cache keys)."""
    import importlib.metadata

    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "absent"
    return f"triton {triton} cuda {torch.version.cuda}"


def synchronize() -> None:
    """Waits for the kernels queued on the current CUDA device (none under the interpreter)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


#: the ``kiln.codegens`` entry point (see kiln_loopir.codegen_registry). CPU is listed for
#: ``TRITON_INTERPRET=1`` runs; the cpp codegen has the higher priority there.
CODEGEN = CodegenEntry(name="triton", devices=("cuda", "cpu"), compile_error=TritonCompileError,
                       build=build, priority=0, philox=True, prepare=prepare,
                       toolchain=toolchain, synchronize=synchronize)


def __getattr__(name):
    if name in ("compile_fx", "compile_aten", "compile_schedule"):
        from . import pipeline as _m

        return getattr(_m, name)
    raise AttributeError(name)
