"""``max()``/``min()`` over one-element tensors, captured without reading their values.

Eager compares the items with ``item > best`` (``<`` for ``min``) and ``bool()`` of the
answer, keeping the earlier item on ties and on NaN (every comparison with NaN is False).
The graph chooses the same value with ``torch.where(item > best, item, best)``, item by
item, so no value is read while tracing (torch.compile's ``torch.maximum`` propagates NaN
instead, not eager's answer).

The chosen value is a new tensor where eager returns one of the items itself. The frame
must not be able to tell: ``OutputGraph.selections`` records each choice, and the frame is
traced again with max/min over tensors breaking the graph (``RefusalRestart``) when it
compares the result's identity (``is``, ``id()``), writes in place into the result or an
item after the choice, or when the result and an item both outlive the graph."""

from __future__ import annotations

import dataclasses
import operator

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ...exc import Unsupported
from ..restarts import RefusalRestart
from .base import VariableTracker

#: ``OutputGraph.refused`` holds it on the trace after a choice was observable
REFUSED = "tensor max/min"


@dataclasses.dataclass
class Selection:
    """One ``max``/``min`` over tensors: the result's node, the items' and the result's
    fake values with their version counters when the choice was made."""

    result: torch.fx.Node
    fakes: list[torch.Tensor]
    versions: list[int]


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def select_extreme(tx, fn, items: list[VariableTracker]) -> VariableTracker:
    """``fn(items)`` (``fn``: ``max`` or ``min``) over tensor trackers, or Unsupported."""
    from .tensor import TensorVariable

    out = tx.output
    what = f"{fn.__name__}() over tensors"
    if REFUSED in out.refused or out.tracing_bodies:
        raise Unsupported(f"{what} (data-dependent)")
    if not items or not all(isinstance(it, TensorVariable) and it.source is None
                            for it in items):
        raise Unsupported(f"{what} that are not all intermediates (data-dependent)")
    fakes = [it.example_value for it in items]
    first = fakes[0]
    for f in fakes:
        if type(f).__name__ != "FakeTensor" or f.layout is not torch.strided or \
                f._base is not None or any(not isinstance(s, int) for s in f.shape) or \
                f.numel() != 1 or f.shape != first.shape or f.dtype != first.dtype or \
                f.device != first.device or f.requires_grad != first.requires_grad:
            # more than one element: eager's bool() raises; views, mixed dtypes or
            # shapes: the chosen object's own metadata cannot be rebuilt by one where
            raise Unsupported(f"{what} of other than one-element, same-kind tensors "
                              "(data-dependent)")
    if first.requires_grad:
        # backward through where gives the items not chosen a zero gradient; eager's
        # graph never reaches them (their .grad stays None)
        raise Unsupported(f"{what} that require grad (data-dependent)")
    inputs = {_storage(f) for f in _input_fakes(out)}
    if any(_storage(f) in inputs for f in fakes):
        raise Unsupported(f"{what} sharing memory with an input (data-dependent)")
    compare = operator.gt if fn is max else operator.lt
    best = items[0]
    for item in items[1:]:
        cond = out.create_graph_op("call_function", compare, [item, best], {})
        best = out.create_graph_op("call_function", torch.where, [cond, item, best], {})
    if len(items) == 1:
        return best  # the item itself, as eager returns it
    out.selections.append(Selection(best.node, fakes + [best.example_value],
                                    [f._version for f in fakes]
                                    + [best.example_value._version]))
    return best


def _input_fakes(out) -> list[torch.Tensor]:
    """The fakes of what the graph reads from outside (inputs, module tensors): memory the
    caller holds whatever the graph returns."""
    return [n.meta["example_value"] for n in out.graph.nodes
            if n.op in ("placeholder", "get_attr")
            and isinstance(n.meta.get("example_value"), torch.Tensor)]


def refuse_observed(out, why: str):
    """The frame observed a choice: trace it again with max/min over tensors breaking."""

    out.selection_observed = True  # (also when a caller turns the restart into a break)
    raise RefusalRestart(REFUSED, Unsupported(f"{why}: the result of max()/min() over "
                                                "tensors is a new tensor, eager's is one "
                                                "of the items"))


def is_selection(out, node) -> bool:
    return any(s.result is node for s in out.selections)


def check_unobserved(out, outputs: list[VariableTracker]) -> None:
    """At a graph's end: no write into a choice's tensors since it was made, and not both
    the result and an item among what outlives the graph (``outputs``, the inputs)."""
    if not out.selections:
        return
    if out.selection_observed:
        refuse_observed(out, "`is` or id() on it")
    escaping = {_storage(f) for f in _input_fakes(out)}
    for v in outputs:
        ex = getattr(v, "example_value", None)
        if isinstance(ex, torch.Tensor):
            escaping.add(_storage(ex))
    for s in out.selections:
        if [f._version for f in s.fakes] != s.versions:
            refuse_observed(out, "a write in place after the choice")
        *item_fakes, result = s.fakes
        if _storage(result) in escaping and any(_storage(f) in escaping for f in item_fakes):
            refuse_observed(out, "the result and an item both outlive the graph")
