"""kiln: make unmodified PyTorch programs faster.

    import kiln

    @kiln.compile                      # or kiln.compile(model, dynamic=True, options={...})
    def f(x, y):
        return x.sin() + y.cos()

    print(kiln.stats())

- ``kiln.compile``: torch.compile's signature over kiln's frontend, backend ``"kiln"``.
- ``kiln.compile_repeated_blocks(model)`` / ``@kiln.compile_region``: one compile serves every
  instance of a repeated block (regional compilation).
- ``kiln.Options``: the backend's options (``codegen``, ``debug``, ``debug_dir``, ``cpp_flags``,
  ``mode``); ``KILN_COMPILE_DEBUG=1`` writes a debug folder per compiled graph.
- ``kiln.stats()`` / ``kiln.reset_stats()``: graphs compiled, kernels, cache hits, fallbacks.
- ``kiln.reset()``: forget everything compiled in this process (like ``torch.compiler.reset()``).
- ``kiln.save_cache_artifacts()`` / ``kiln.load_cache_artifacts(blob)``: ship a warm cache.
- ``kiln.backend``: the ``kiln`` and ``loopir_interpret`` backends (entry points
  ``kiln.backends``), ``compile_aten``, ``codegen_for_device`` (codegens are plug-ins found
  through the entry points ``kiln.codegens``: cpp for CPU, triton for CUDA).

See docs/kiln.md.
"""

from __future__ import annotations

from kiln_runtime import data_aliases  # noqa: F401  (Tensor.data remembers its aliases)

from . import higher_order  # noqa: F401  (installs loopir's subgraph compiler)
from .api import compile
from .options import Options
from .regional import compile_region, compile_repeated_blocks
from .stats import Stats, reset_stats, stats

__version__ = "0.1.0"

__all__ = [
    "compile",
    "compile_repeated_blocks",
    "compile_region",
    "Options",
    "Stats",
    "stats",
    "reset_stats",
    "reset",
    "backend",
    "save_cache_artifacts",
    "load_cache_artifacts",
]


def reset() -> None:
    """Forget everything compiled in this process, like ``torch.compiler.reset()``: the
    frontend's cache entries, skip marks and frame state, CUDA-graph trees, and kiln's
    counters.  The on-disk cache stays (``KILN_CACHE_DIR``): a later compile is warm."""
    import sys

    import kiln_frontend

    kiln_frontend.reset()
    cudagraphs = sys.modules.get("kiln_runtime.cudagraphs")
    if cudagraphs is not None:
        cudagraphs.reset()
    reset_stats()


def save_cache_artifacts() -> bytes:
    """The on-disk cache entries this process used (compiled graphs and their kernels) as one
    blob, for a deployment to ship (docs/runtime.md)."""
    import sys

    import kiln_runtime

    if "kiln.cache" in sys.modules:  # entries still being written in the background
        sys.modules["kiln.cache"].flush()

    return kiln_runtime.save_cache_artifacts()


def load_cache_artifacts(blob: bytes) -> int:
    """Install a ``save_cache_artifacts`` blob into this machine's cache (``KILN_CACHE_DIR``):
    later compiles of the same graphs are warm. Returns the number of entries installed.

    This runs what the blob holds: its entries are pickles and shared libraries that later
    compiles load and execute. Load only blobs you would run as a program."""
    import kiln_runtime

    return len(kiln_runtime.load_cache_artifacts(blob))


def __getattr__(name: str):
    # kiln.backend imports the whole compiler stack: load it on first use
    if name == "backend":
        import importlib

        return importlib.import_module(".backend", __name__)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
