"""Traceable tensor subclasses (``__tensor_flatten__``/``__tensor_unflatten__`` with
``__torch_dispatch__``: DTensor, TwoTensor, quantized weights) as graph inputs.

Such a tensor is captured like a plain one: its fake value is the subclass around fake inner
tensors (``FakeTensorMode.from_tensor`` fakes each inner tensor), so each op on it runs the
subclass's ``__torch_dispatch__`` while tracing, and the backend flattens it at the graph
boundary (``kiln_aotgrad.subclasses``). What the graph assumed is guarded: the outer tensor
(TENSOR_MATCH: class, dtype, device, sizes, strides), the flatten metadata
(``__tensor_flatten__()[1]``: DTensor's placements and mesh, a quantized tensor's settings)
and each inner tensor (TENSOR_MATCH, recursively). Its sizes stay static. A subclass that
overrides ``__torch_function__`` stays uncaptured (tensor.py): its Python code runs on every
call, and kiln does not trace it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import Guard, GuardKind, TensorGuard
from ...sources import AttrSource, ChainedSource

__all__ = ["traceable_subclass", "FlattenContextSource", "guard_subclass"]


def traceable_subclass(cls: type) -> bool:
    """A wrapper subclass kiln traces through: it flattens to inner tensors, dispatches in
    ``__torch_dispatch__`` and leaves ``__torch_function__`` disabled (DTensor, torchao)."""
    return (isinstance(cls, type) and issubclass(cls, torch.Tensor)
            and callable(getattr(cls, "__tensor_flatten__", None))
            and callable(getattr(cls, "__tensor_unflatten__", None))
            and getattr(cls, "__torch_dispatch__", None)
            is not torch._C._disabled_torch_dispatch_impl
            and getattr(cls, "__torch_function__", None)
            is torch._C._disabled_torch_function_impl)


@dataclasses.dataclass(frozen=True)
class FlattenContextSource(ChainedSource):
    """``base.__tensor_flatten__()[1]``: a subclass's flatten metadata (guarded only)."""

    def text_on(self, base: str) -> str:
        return f"{base}.__tensor_flatten__()[1]"

    def short_name(self) -> str:
        return f"{self.base_source.short_name()}_flatten_ctx"

    def reconstruct(self, codegen: Any) -> None:  # pragma: no cover - guard-only source
        raise Unsupported("the flatten metadata of a tensor subclass is not a value")


def _comparable(ctx: Any) -> bool:
    try:
        return bool(ctx == ctx)
    except Exception:  # noqa: BLE001
        return False


def guard_subclass(output, source, value: torch.Tensor) -> None:
    """Guard the flatten metadata and the inner tensors of ``value`` at ``source`` (the
    outer TENSOR_MATCH is add_graph_input's). Unsupported when the metadata cannot be
    compared (the caller leaves the tensor uncaptured then)."""
    attrs, ctx = value.__tensor_flatten__()
    if not _comparable(ctx):
        raise Unsupported(f"the flatten metadata of a {type(value).__qualname__} cannot be "
                          "compared, so it cannot be guarded")
    output.guards.add(Guard(FlattenContextSource(source), GuardKind.CONSTANT_MATCH, ctx,
                            what=f"{type(value).__qualname__} metadata"))
    for attr in attrs:
        inner = getattr(value, attr)
        inner_source = AttrSource(source, attr)
        if not isinstance(inner, torch.Tensor):  # an opaque member (DTensor's device_mesh)
            kind, expected = (GuardKind.CONSTANT_MATCH, inner) if _comparable(inner) else \
                (GuardKind.ID_MATCH, id(inner))
            output.guards.add(Guard(inner_source, kind, expected,
                                    what=f"{type(value).__qualname__}.{attr}"))
            continue
        output.guards.add(Guard(inner_source, GuardKind.TENSOR_MATCH, TensorGuard(inner)))
        if traceable_subclass(type(inner)):
            guard_subclass(output, inner_source, inner)
