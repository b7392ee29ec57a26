"""torch.distributed's DTensor API inside a captured frame (tensor parallel's hooks).

``parallelize_module`` installs forward hooks that turn a module's input into a DTensor
(``DTensor.from_local``), redistribute it, and turn the output back into a local tensor
(``.redistribute(...)``, ``.to_local()``). kiln traces them into the graph, as torch.compile
does:

- a device mesh and a placement (``Shard(0)``, ``Replicate()``, ``Partial()``) are guarded
  constants (``DistributedConstantVariable``): a placement by equality, a mesh by identity;
  a placement made in the frame (``Replicate()``) is a constant too;
- ``DTensor.from_local`` and the DTensor methods ``to_local``, ``redistribute`` and
  ``full_tensor`` become one ``call_function`` node each whose graph arguments are the
  tensors only: the mesh, the placements and every other constant are baked into the node's
  target (an FX graph cannot print a mesh as an argument). The backend traces through them
  (aotgrad's subclass boundary), so the ATen graph holds plain ops and functional collectives;
- ``redistribute(..., async_op=True)`` is traced as a synchronous redistribute: the result is
  the same, and the collective's ``wait_tensor`` lands right after it in the graph (the
  scheduler, not the hook, decides what overlaps).

torch.distributed.tensor costs about 2 s to import, so nothing here imports it: the trackers
apply once the program has imported it (``_api()`` is None before)."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from .base import VariableTracker, constant_or_break

__all__ = ["DistributedConstantVariable", "DTensorCallVariable", "PlacementClassVariable",
           "wrap_distributed", "dtensor_attribute"]

#: DTensor methods traced as one node each
DTENSOR_METHODS = frozenset({"to_local", "redistribute", "full_tensor"})
#: DTensor attributes that are constants of the traced value
DTENSOR_CONSTANT_ATTRS = frozenset({"placements", "device_mesh"})

_cached: tuple | None = None


def _api() -> tuple | None:
    """(DTensor, DeviceMesh, Placement) once the program imported torch.distributed.tensor."""
    global _cached
    if _cached is None:
        if "torch.distributed.tensor" not in sys.modules:
            return None
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.placement_types import Placement

        _cached = (DTensor, DeviceMesh, Placement)
    return _cached


class DistributedConstantVariable(VariableTracker):
    """A device mesh or a placement: a constant of the graph, guarded where it came from."""

    def __init__(self, value: Any, *, source=None):
        super().__init__(source=source)
        self.value = value

    @classmethod
    def wrap(cls, builder, value):
        _, mesh_type, _ = _api()
        if isinstance(value, mesh_type):  # meshes compare their rank lists: identity is cheaper
            builder.install_guard(GuardKind.ID_MATCH, id(value), what="device mesh")
        else:
            builder.install_guard(GuardKind.CONSTANT_MATCH, value, what="placement")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return type(self.value)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .constant import ConstantVariable, is_constant_value

        value = getattr(self.value, name)
        if is_constant_value(value):
            return ConstantVariable.create(value)
        raise Unsupported(f"attribute {name!r} of a {type(self.value).__qualname__}")

    def describe(self) -> str:
        return f"DistributedConstantVariable({self.value!r})"

    def reconstruct(self, codegen) -> None:
        self.reload_or_load(codegen, self.value)


def _constant(tracker: VariableTracker, what: str) -> Any:
    return constant_or_break(tracker, f"{what} with an argument that is neither a tensor nor "
                                      f"a constant ({tracker.describe()})")


class _Slot:
    """Where the i-th tensor argument goes in a baked call."""

    def __init__(self, i: int):
        self.i = i


def baked_call(tx, fn, args: list, kwargs: dict, name: str,
               overrides: dict | None = None) -> VariableTracker:
    """``fn(*args, **kwargs)`` as one node whose graph arguments are the tensors of ``args``
    and ``kwargs``; every other argument is a constant baked into the node's target."""
    from .tensor import TensorVariable

    tensors: list[VariableTracker] = []

    def bake(v):
        v = tx.realize(v) if hasattr(tx, "realize") else v
        if isinstance(v, TensorVariable):
            tensors.append(v)
            return _Slot(len(tensors) - 1)
        return _constant(v, name)

    cargs = [bake(a) for a in args]
    ckwargs = {k: bake(v) for k, v in kwargs.items()}
    ckwargs.update(overrides or {})

    def call(*ts):
        fill = (lambda v: ts[v.i] if isinstance(v, _Slot) else v)  # noqa: E731
        return fn(*[fill(a) for a in cargs], **{k: fill(v) for k, v in ckwargs.items()})

    # the constants are in the name (a compile cache keys call targets by name)
    baked = repr(([a if not isinstance(a, _Slot) else "<tensor>" for a in cargs],
                  {k: v if not isinstance(v, _Slot) else "<tensor>" for k, v in ckwargs.items()}))
    call.__name__ = call.__qualname__ = \
        f"{name}_{hashlib.sha256(baked.encode()).hexdigest()[:12]}"
    return tx.output.create_graph_op("call_function", call, tensors, {})


class DTensorCallVariable(VariableTracker):
    """``DTensor.from_local`` (and a DTensor method bound to its tensor): calling it adds
    one baked node."""

    def __init__(self, fn: Any, name: str, bound: VariableTracker | None = None, *,
                 source=None):
        super().__init__(source=source)
        self.fn, self.name, self.bound = fn, name, bound

    def call_function(self, tx, args, kwargs):
        args = [self.bound, *args] if self.bound is not None else list(args)
        # the same values as async_op=True; the collective's wait follows it in the graph
        overrides = {"async_op": False} if self.name == "DTensor_redistribute" else None
        return baked_call(tx, self.fn, args, dict(kwargs), self.name, overrides)

    def children(self):
        return [self.bound] if self.bound is not None else []

    def describe(self) -> str:
        return f"DTensorCallVariable({self.name})"

    def reconstruct(self, codegen) -> None:
        if self.bound is not None:
            codegen(self.bound)
            codegen.load_attr(self.name.removeprefix("DTensor_"))
            return
        self.reload_or_load(codegen, self.fn)


class PlacementClassVariable(VariableTracker):
    """``Shard``, ``Replicate``, ``Partial``: calling one with constants makes a placement
    (a constant)."""

    def __init__(self, cls: type, *, source=None):
        super().__init__(source=source)
        self.cls = cls

    def as_python_constant(self) -> Any:
        return self.cls

    def call_function(self, tx, args, kwargs):
        name = self.cls.__qualname__
        value = self.cls(*[_constant(a, name) for a in args],
                         **{k: _constant(v, name) for k, v in kwargs.items()})
        return DistributedConstantVariable(value)

    def describe(self) -> str:
        return f"PlacementClassVariable({self.cls.__qualname__})"

    def reconstruct(self, codegen) -> None:
        self.reload_or_load(codegen, self.cls)


def wrap_distributed(builder, value: Any) -> VariableTracker | None:
    """The builder's hook: a tracker for a mesh, a placement or ``DTensor.from_local``, None
    for anything else (and for everything before torch.distributed.tensor is imported)."""
    api = _api()
    if api is None:
        return None
    dtensor, mesh_type, placement_type = api
    if issubclass(type(value), (mesh_type, placement_type)):
        return DistributedConstantVariable.wrap(builder, value)
    if isinstance(value, type) and issubclass(value, placement_type):
        builder.install_identity_guard(value, GuardKind.ID_MATCH, what="placement class")
        return PlacementClassVariable(value, source=builder.source)
    if value is dtensor.from_local:
        builder.install_identity_guard(value, what="DTensor.from_local")
        return DTensorCallVariable(value, "DTensor_from_local", source=builder.source)
    return None


@upper.provide
def dtensor_attribute(tx, tensor, name: str) -> VariableTracker | None:
    """``t.<name>`` of a DTensor tracker (``to_local``, ``redistribute``, ``full_tensor``,
    ``placements``, ``device_mesh``), None where ``t`` is no DTensor or ``name`` is another."""
    api = _api()
    if api is None or not isinstance(tensor.example_value, api[0]):
        return None
    if name in DTENSOR_METHODS:
        return DTensorCallVariable(getattr(api[0], name), f"DTensor_{name}", bound=tensor)
    if name in DTENSOR_CONSTANT_ATTRS:
        from .containers import TupleVariable

        value = getattr(tensor.example_value, name)
        if isinstance(value, tuple):
            return TupleVariable([DistributedConstantVariable(v) for v in value])
        return DistributedConstantVariable(value)
    return None
