"""kiln-runtime: running kiln-compiled graphs.

- ``cache_dir()``: ``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (created 0700; a folder others could
  write is refused with one ``UnsafeCacheDirWarning``: it holds code kiln runs).
- ``disk_cache``: artifacts by (kind, key) on disk; atomic writes; corrupt entries rebuilt.
- ``load(module, config=None)``: exec a generated wrapper with its kernels -> callable.
- ``launch``: helpers generated wrappers call (``empty_strided_cpu``, ``reinterpret_tensor``).
- ``counters``: cache hits/misses/corrupt entries (also per kind), wrappers loaded.
- ``save_cache_artifacts()`` / ``load_cache_artifacts(blob)``: ship the entries a process used
  (loading a blob runs what it holds).
- ``compile_timer``: named compile phases per graph (``KILN_LOGS=perf`` prints them).
- ``cudagraphs``: CUDA-graph record/replay (``mode="reduce-overhead"``), imported on use.
- ``data_aliases``: ``Tensor.data`` through a property that remembers the aliases it hands
  out, so weight guards see writes through them (installed when this package is imported).

Depends only on torch; it receives plain data (Python source + a namespace dict).
"""

from __future__ import annotations

from . import compile_timer, data_aliases, disk_cache, launch  # noqa: F401
from .artifacts import load_cache_artifacts, save_cache_artifacts
from .counters import counters, reset_counters
from .disk_cache import DiskCache, UnsafeCacheDir, UnsafeCacheDirWarning, cache_dir, hash_key
from .launch import (
    assert_size_stride,
    empty_strided,
    empty_strided_cpu,
    empty_strided_cuda,
    reinterpret_tensor,
)
from .loader import CompiledGraph, load

__all__ = [
    "CompiledGraph",
    "DiskCache",
    "UnsafeCacheDir",
    "UnsafeCacheDirWarning",
    "assert_size_stride",
    "cache_dir",
    "compile_timer",
    "counters",
    "disk_cache",
    "empty_strided",
    "empty_strided_cpu",
    "empty_strided_cuda",
    "hash_key",
    "launch",
    "load",
    "load_cache_artifacts",
    "reinterpret_tensor",
    "reset_counters",
    "save_cache_artifacts",
]


def __getattr__(name: str):
    if name == "cudagraphs":  # only mode="reduce-overhead" needs it
        import importlib

        return importlib.import_module(".cudagraphs", __name__)
    raise AttributeError(f"module 'kiln_runtime' has no attribute {name!r}")
