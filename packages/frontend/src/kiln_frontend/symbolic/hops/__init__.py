"""The registry of higher-order operators: operators that take callables (torch.cond's
branches, while_loop's cond and body, an autograd.Function's forward and backward).

One entry per operator (``HigherOrderOp``) says how the frontend captures a call of it: which
Python objects a user calls it through, and ``capture(tx, args, kwargs)``, which traces each
callable argument as its own FX subgraph (``subgraph.py``) and emits one node. The entry also
names the operator's other rules, which live where the package layering puts them (the frontend
imports no other kiln package):

- fake-tensor rule: how the node's ``example_value`` is computed (the operator run on fake
  tensors with its subgraphs);
- autograd rule: what makes the joint graph's backward (torch's own rule for cond, or a
  backward subgraph the node carries);
- lowering: the loopir lowering registered for the node's target
  (``kiln_loopir/lowerings/higher_order.py``).

A ``torch._ops.HigherOrderOperator`` without an entry is a graph break naming it. Adding an
operator: write its capture in a module of this package and ``register(HigherOrderOp(...))``
there (a second entry for a name or a callable raises), and import that module in
``kiln_frontend.symbolic``'s ``__init__`` (this registry, low in the layers, imports none of
its entries); docs/higher-order-ops.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ...exc import Unsupported
from ..variables.base import KnownCallableVariable, VariableTracker


@dataclasses.dataclass(frozen=True)
class HigherOrderOp:
    """One higher-order operator's entry.

    - ``name``: how messages and docs name it (``torch.cond``);
    - ``callables``: the objects a user's code reaches it through (by identity);
    - ``capture(tx, args, kwargs) -> tracker``: traces the callable arguments and emits the
      node (or, where the call needs no node, e.g. a constant predicate, inlines it);
    - ``fake_rule``, ``autograd_rule``, ``lowering``: where each of those rules is and what
      it does (see the module docstring).
    """

    name: str
    callables: tuple[Any, ...]
    capture: Callable[..., VariableTracker]
    fake_rule: str
    autograd_rule: str
    lowering: str


_BY_NAME: dict[str, HigherOrderOp] = {}
_BY_ID: dict[int, tuple[Any, HigherOrderOp]] = {}


def register(op: HigherOrderOp) -> HigherOrderOp:
    """Add ``op``; a name or a callable registered twice raises."""
    if op.name in _BY_NAME:
        raise ValueError(f"higher-order operator {op.name!r} is registered twice")
    for c in op.callables:
        if id(c) in _BY_ID:
            raise ValueError(f"{c!r} already belongs to higher-order operator "
                             f"{_BY_ID[id(c)][1].name!r}")
    _BY_NAME[op.name] = op
    for c in op.callables:
        _BY_ID[id(c)] = (c, op)
    return op


def lookup(value: Any) -> HigherOrderOp | None:
    hit = _BY_ID.get(id(value))
    return hit[1] if hit is not None and hit[0] is value else None


def registered() -> dict[str, HigherOrderOp]:
    return dict(_BY_NAME)


def entry(name: str) -> HigherOrderOp:
    """The entry named ``name`` (an operator reached another way than by calling an object:
    ``Function.apply`` under grad)."""
    return _BY_NAME[name]


def hop_name(value: Any) -> str:
    return f"torch.ops.higher_order.{getattr(value, '_name', None) or getattr(value, '__name__', value)}"


class HigherOrderOpVariable(KnownCallableVariable):
    """A registered higher-order operator; calling it runs its entry's capture."""

    def __init__(self, fn: Any, op: HigherOrderOp, *, source=None):
        super().__init__(fn, source=source)
        self.op = op

    def call_function(self, tx, args, kwargs):
        return self.op.capture(tx, list(args), dict(kwargs))

    def describe(self) -> str:
        return f"HigherOrderOpVariable({self.op.name})"


class UnknownHigherOrderOpVariable(KnownCallableVariable):
    """A higher-order operator kiln has no entry for: loading it works, calling it is a graph
    break naming it (it then runs in Python, as eager runs it)."""

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"higher-order operator {hop_name(self.fn)} has no entry in kiln's "
                          "registry (kiln_frontend.symbolic.hops)")

    def describe(self) -> str:
        return f"UnknownHigherOrderOpVariable({hop_name(self.fn)})"


def hop_tracker(builder, value: Any) -> VariableTracker | None:
    """The tracker for ``value`` if it is a higher-order operator, else None."""
    op = lookup(value)
    if op is not None:
        if builder.source is not None:
            builder.install_identity_guard(value, what="higher-order operator")
        return HigherOrderOpVariable(value, op, source=builder.source)
    if isinstance(value, torch._ops.HigherOrderOperator):
        if builder.source is not None:
            builder.install_identity_guard(value, what="higher-order operator")
        return UnknownHigherOrderOpVariable(value, source=builder.source)
    return None

