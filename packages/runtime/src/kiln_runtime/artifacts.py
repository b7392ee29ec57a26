"""``save_cache_artifacts() -> bytes`` / ``load_cache_artifacts(blob)``: ship a warm cache.

The blob holds every on-disk cache entry this process hit or wrote (``disk_cache.touched()``):
graph-level artifacts (kind ``graph``: wrapper source, kernel sources, output structure) and
the kernel-level entries they load (kind ``cpp``: the compiled ``.so``; Triton kernels when
that codegen caches them), so a fresh machine of the same kind that loads the blob compiles
nothing. Entries keep their keys, which name the versions of kiln, torch, triton, the C++
compiler and the device: a blob from another kind of machine loads but never hits.
"""

from __future__ import annotations

import tarfile

from . import disk_cache

__all__ = ["load_cache_artifacts", "save_cache_artifacts"]


def save_cache_artifacts() -> bytes:
    """One blob of the cache entries this process used (see the module docstring)."""
    return disk_cache.pack(disk_cache.touched())


def load_cache_artifacts(blob: bytes) -> list[tuple[str, str]]:
    """Install a ``save_cache_artifacts`` blob into ``cache_dir()``; returns the (kind, key)
    entries now present. Raises ``ValueError`` for bytes that are not such a blob.

    This runs what the blob holds: its entries are pickles and shared libraries that later
    compiles load and execute (the manifests catch damage, not malice). Load only blobs you
    would run as a program."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"load_cache_artifacts() takes bytes, not {type(blob).__name__}")
    try:
        return disk_cache.unpack(bytes(blob))
    except (tarfile.TarError, EOFError) as e:
        raise ValueError(f"not a kiln cache blob: {e}") from e
