"""Test helpers for code that compiles with kiln, as ``torch.testing`` is for torch.

- ``Int8WeightOnly``: a weight-only int8 quantized weight as a traceable tensor subclass
  (torchao's design, dispatching in ``__torch_dispatch__`` only): an int8 ``qdata`` [out, in]
  and a per-row ``scale`` [out]; any op dequantizes it first. kiln's subclass support is
  checked with it (docs/tensor-subclasses.md); a user can check a model's quantized path the
  same way.
- ``one_process_mesh()``: a one-rank gloo ``DeviceMesh`` on CPU, for DTensor code without
  launching processes.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree

__all__ = ["Int8WeightOnly", "one_process_mesh"]

aten = torch.ops.aten


class Int8WeightOnly(torch.Tensor):
    """int8 ``qdata`` [out, in] and per-row ``scale`` [out]: any op dequantizes first."""

    @staticmethod
    def __new__(cls, qdata, scale):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype,
                                                   device=qdata.device)

    def __init__(self, qdata, scale):
        self.qdata, self.scale = qdata, scale

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["qdata"], inner["scale"])

    def dequantize(self):
        return self.qdata.to(self.scale.dtype) * self.scale[:, None]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            return cls(args[0].qdata, args[0].scale)
        args, kwargs = pytree.tree_map_only(cls, cls.dequantize, (args, kwargs or {}))
        return func(*args, **kwargs)

    @classmethod
    def quantize(cls, w):
        """Symmetric per-row quantization of a float weight [out, in]."""
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
        return cls((w / scale[:, None]).round().clamp(-128, 127).to(torch.int8), scale)


@contextlib.contextmanager
def one_process_mesh():
    """A one-rank CPU ``DeviceMesh`` (gloo, in-memory store); the process group is destroyed
    on exit when this made it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if owned:
            dist.destroy_process_group()
