"""``t.data`` read inside the graph: a ``detach`` of ``t``.

Eager's ``t.data`` is a tensor over ``t``'s memory without autograd history and with a
version counter of its own, so a write through it moves no counter of ``t``'s (autograd
does not see it; nor does ``kiln_runtime.data_aliases`` unless the property is called).
``t.detach()`` has the same values, memory and flags but shares ``t``'s counter; the two
only differ once something writes into that memory, or once the alias outlives the graph
(then Python may write through it). ``OutputGraph.data_takes`` records each take, and the
frame is traced again with ``.data`` breaking the graph (``RefusalRestart``) when, after
the take, the graph writes into ``t``'s memory (through the alias, ``t`` or a view: the
shared counter moves) or returns or keeps something over that memory that is not ``t``.
So reads are captured; a write through ``.data`` runs in Python, as eager runs it."""

from __future__ import annotations

import dataclasses

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ...exc import Unsupported
from ..restarts import RefusalRestart
from .base import VariableTracker

#: ``OutputGraph.refused`` holds it on the trace after a take was written or escaped
REFUSED = "tensor .data"


@dataclasses.dataclass
class DataTake:
    """One ``t.data``: its node, ``t``'s node, and the fake's version counter then (shared
    by ``t``, its views and the alias in the graph)."""

    alias: torch.fx.Node
    base: torch.fx.Node
    fake: torch.Tensor
    version: int


def take_data(tx, tensor) -> VariableTracker:
    """``tensor.data`` (a ``TensorVariable``), or Unsupported."""
    out = tx.output
    if REFUSED in out.refused or out.tracing_bodies:
        raise Unsupported("Tensor.data: a write through it, or the alias outliving the "
                          "graph, is not seen by autograd's version counters (runs in "
                          "Python)")
    fake = tensor.example_value
    if type(fake).__name__ != "FakeTensor" or fake.layout is not torch.strided:
        raise Unsupported("Tensor.data of a tensor subclass")
    alias = out.create_graph_op("call_method", "detach", [tensor], {})
    out.data_takes.append(DataTake(alias.node, tensor.node, fake, fake._version))
    return alias


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def check_data_takes(out, outputs: list[VariableTracker]) -> None:
    """At a graph's end: nothing wrote into a taken tensor's memory since the take, and no
    output but the tensor itself lies over that memory."""

    for take in out.data_takes:
        if take.fake._version != take.version:
            raise RefusalRestart(REFUSED, Unsupported(
                "Tensor.data: a write into its memory after the take (eager's alias has a "
                "version counter of its own)"))
        memory = _storage(take.fake)
        for v in outputs:
            ex = getattr(v, "example_value", None)
            if isinstance(ex, torch.Tensor) and v.node is not take.base and \
                    _storage(ex) == memory:
                raise RefusalRestart(REFUSED, Unsupported(
                    "Tensor.data: the alias outlives the graph (Python may write through "
                    "it)"))
