"""Helpers that generated wrappers call: allocation shortcuts and views of buffers.

``kiln_runtime.load`` puts ``HELPERS`` in every wrapper's namespace (a wrapper's source uses
them without importing them); a standalone ``output_code.py`` imports them:
``from kiln_runtime.launch import empty_strided_cpu, reinterpret_tensor``.
"""

from __future__ import annotations

import torch

_empty_strided = torch.empty_strided
_as_strided = torch.as_strided


def empty_strided(size, stride, dtype, device) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device=device)


def empty_strided_cpu(size, stride, dtype) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device="cpu")


def empty_strided_cuda(size, stride, dtype) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device="cuda")


def reinterpret_tensor(t: torch.Tensor, size, stride, offset: int = 0) -> torch.Tensor:
    """A view of ``t``'s memory with the given size/stride, ``offset`` elements past ``t``'s
    own storage offset (a buffer reused under a new shape, or an output that is a view)."""
    return _as_strided(t, size, stride, t.storage_offset() + offset)


def assert_size_stride(t: torch.Tensor, size, stride) -> None:
    """Check a tensor's size and stride (used in debug wrappers)."""
    if tuple(t.size()) != tuple(size) or tuple(t.stride()) != tuple(stride):
        raise AssertionError(
            f"expected size {tuple(size)} stride {tuple(stride)}, "
            f"got size {tuple(t.size())} stride {tuple(t.stride())}"
        )


#: the names every generated wrapper may use without importing them
HELPERS = {
    "empty_strided": empty_strided,
    "empty_strided_cpu": empty_strided_cpu,
    "empty_strided_cuda": empty_strided_cuda,
    "reinterpret_tensor": reinterpret_tensor,
    "assert_size_stride": assert_size_stride,
}
