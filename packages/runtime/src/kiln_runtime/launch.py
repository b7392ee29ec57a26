"""Helpers that generated wrappers call: allocation shortcuts and views of buffers.

``kiln_runtime.load`` puts ``HELPERS`` in every wrapper's namespace (a wrapper's source uses
them without importing them); a standalone ``output_code.py`` imports them:
``from kiln_runtime.launch import empty_strided_cpu, reinterpret_tensor``.
"""

from __future__ import annotations

import types

import torch

_empty_strided = torch.empty_strided
_as_strided = torch.as_strided
# device objects, not strings: a string is parsed at every call (about 0.2 us of a 1.4 us
# allocation on CPU, thread time); "cuda" without an index is the current device either way
_CPU = torch.device("cpu")
_CUDA = torch.device("cuda")


def empty_strided(size, stride, dtype, device) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device=device)


def empty_strided_cpu(size, stride, dtype) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device=_CPU)


def empty_strided_cuda(size, stride, dtype) -> torch.Tensor:
    return _empty_strided(size, stride, dtype=dtype, device=_CUDA)


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


class DirectOps:
    """``aten`` in a generated wrapper: ``aten.mm.default`` is the operator's C++ callable
    (``OpOverload._op``), which ``OpOverload.__call__`` only forwards to, so an extern call
    costs one Python frame less (about 1.3 us of 2.6 us for a small ``mm``: a host-bound GPU
    graph makes dozens per call); or, for the overloads in ``TORCH_BINDINGS``, torch's own
    function for them. Overloads are looked up once per op, on first use."""

    def __init__(self, namespace):
        self._namespace = namespace

    def __getattr__(self, name: str):
        packet = getattr(self._namespace, name)
        overloads = types.SimpleNamespace(**{
            o: TORCH_BINDINGS.get(f"{name}.{o}") or _direct(getattr(packet, o))
            for o in packet.overloads()})
        setattr(self, name, overloads)  # found by plain attribute lookup from now on
        return overloads

    def __repr__(self) -> str:
        return f"<DirectOps {self._namespace.name}>"


def _direct(overload):
    """A plain OpOverload's C++ callable; any other kind (one with its own ``__call__``, such
    as an op taking script objects) as it is."""
    return overload._op if type(overload) is torch._ops.OpOverload else overload


#: aten overloads whose torch function binds exactly that overload for the arguments a
#: wrapper passes (the schema's positional arguments in order, its keyword-only ones by name),
#: called instead of ``OpOverload._op``: the torch function parses its arguments into an
#: unboxed call, where ``_op`` boxes them onto a JIT stack first. A 4x16 @ 16x16 ``mm`` on
#: CPU: 11.8k instructions per call (callgrind) and 1.90 us thread time through ``_op``,
#: 8.3k and 1.46 us through ``torch.mm``. (Like ``_op``'s, their results are plain tensors;
#: unlike ``_op``, an active ``TorchFunctionMode`` sees them, as it sees inductor's
#: ``extern_kernels.mm``.)
TORCH_BINDINGS: dict[str, object] = {
    "mm.default": torch.mm,
    "bmm.default": torch.bmm,
    "addmm.default": torch.addmm,
    "baddbmm.default": torch.baddbmm,
    "convolution.default": torch.convolution,
}

#: ``aten`` of every generated wrapper (see DirectOps)
aten_direct = DirectOps(torch.ops.aten)


#: the names every generated wrapper may use without importing them
HELPERS = {
    "empty_strided": empty_strided,
    "empty_strided_cpu": empty_strided_cpu,
    "empty_strided_cuda": empty_strided_cuda,
    "reinterpret_tensor": reinterpret_tensor,
    "assert_size_stride": assert_size_stride,
    "aten_direct": aten_direct,
}
