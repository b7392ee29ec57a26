"""kiln: make unmodified PyTorch programs faster.

    import kiln

    @kiln.compile                      # or kiln.compile(model, dynamic=True, options={...})
    def f(x, y):
        return x.sin() + y.cos()

    print(kiln.stats())

- ``kiln.compile``: torch.compile's signature over kiln's frontend, backend ``"kiln"``.
- ``kiln.Options``: the backend's options (``codegen``, ``debug``, ``debug_dir``, ``cpp_flags``,
  ``mode``); ``KILN_COMPILE_DEBUG=1`` writes a debug folder per compiled graph.
- ``kiln.stats()`` / ``kiln.reset_stats()``: graphs compiled, kernels, cache hits, fallbacks.
- ``kiln.backend``: the ``kiln`` and ``loopir_interpret`` backends (entry points
  ``kiln.backends``), ``compile_aten``, ``codegen_for_device``.

See docs/kiln.md.
"""

from __future__ import annotations

from .api import compile
from .options import Options
from .stats import Stats, reset_stats, stats

__version__ = "0.1.0"

__all__ = ["compile", "Options", "Stats", "stats", "reset_stats", "backend"]


def __getattr__(name: str):
    # kiln.backend imports the whole compiler stack: load it on first use
    if name == "backend":
        import importlib

        return importlib.import_module(".backend", __name__)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
