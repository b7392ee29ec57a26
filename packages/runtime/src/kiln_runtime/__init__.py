"""kiln-runtime: running kiln-compiled graphs.

- ``cache_dir()``: ``$KILN_CACHE_DIR`` or ``~/.cache/kiln``.
- ``disk_cache``: artifacts by (kind, key) on disk; atomic writes; corrupt entries rebuilt.
- ``load(module, config=None)``: exec a generated wrapper with its kernels -> callable.
- ``launch``: helpers generated wrappers call (``empty_strided_cpu``, ``reinterpret_tensor``).
- ``counters``: cache hits/misses/corrupt entries, wrappers loaded.

Depends only on torch; it receives plain data (Python source + a namespace dict).
"""

from __future__ import annotations

from . import disk_cache, launch
from .counters import counters, reset_counters
from .disk_cache import DiskCache, cache_dir, hash_key
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
    "assert_size_stride",
    "cache_dir",
    "counters",
    "disk_cache",
    "empty_strided",
    "empty_strided_cpu",
    "empty_strided_cuda",
    "hash_key",
    "launch",
    "load",
    "reinterpret_tensor",
    "reset_counters",
]
