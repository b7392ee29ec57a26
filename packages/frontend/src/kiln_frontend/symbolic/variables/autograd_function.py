"""``MyFunction.apply(...)`` of a user's ``torch.autograd.Function`` while no gradient is
recorded (``torch.no_grad()`` inference): eager then runs only ``forward``, so the trace
inlines it, with a stand-in for ``ctx`` whose bookkeeping (``save_for_backward``,
``mark_non_differentiable``, attributes) has no effect on the result. transformers' BLOOM
calls its GeLU this way on every layer; each call was a graph break.

With grad mode on, the user's ``backward`` is what the gradients must come from: the call is
captured as a higher-order operator whose forward and backward are subgraphs
(``symbolic/hops/autograd_function.py``), or breaks the graph naming the Function."""

from __future__ import annotations

from typing import Any

import torch

from ...exc import Unsupported
from .base import VariableTracker
from .constant import ConstantVariable

#: ctx methods whose only effect is on the backward (none without grad mode)
_BACKWARD_BOOKKEEPING = ("save_for_backward", "save_for_forward", "mark_non_differentiable",
                         "set_materialize_grads", "mark_dirty")


def _uses_setup_context(cls: type) -> bool:
    """New-style Functions define ``forward(*args)`` plus ``setup_context``: no ctx argument."""
    base = torch.autograd.function._SingleLevelFunction
    return getattr(cls, "setup_context", None) is not getattr(base, "setup_context", None)


class AutogradFunctionApplyVariable(VariableTracker):
    """``cls.apply`` of a ``torch.autograd.Function`` subclass ``cls`` (reached through the
    class's own guarded source)."""

    def __init__(self, cls: type, class_tracker: VariableTracker, *, source=None):
        super().__init__(source=source)
        self.cls = cls
        self.class_tracker = class_tracker

    def call_function(self, tx, args, kwargs) -> VariableTracker:
        if torch.is_grad_enabled():
            # the user's backward must make the gradients: forward and backward as subgraphs
            # of one node (symbolic/hops/autograd_function.py)
            from ..hops import entry

            return entry("autograd.Function").capture(tx, self.cls, self.class_tracker,
                                                      list(args), dict(kwargs))
        forward = self.class_tracker.var_getattr(tx, "forward")
        if _uses_setup_context(self.cls):
            return tx.call_function(forward, list(args), dict(kwargs))
        ctx = InlinedFunctionCtxVariable(len(args))
        return tx.call_function(forward, [ctx, *args], dict(kwargs))

    def describe(self) -> str:
        return f"AutogradFunctionApplyVariable({self.cls.__qualname__})"


class InlinedFunctionCtxVariable(VariableTracker):
    """The ``ctx`` handed to an inlined ``forward``: attributes set on it are kept for the
    forward's own reads; backward bookkeeping does nothing."""

    def __init__(self, num_inputs: int):
        super().__init__()
        self.num_inputs = num_inputs
        self.attrs: dict[str, VariableTracker] = {}

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in self.attrs:
            return self.attrs[name]
        if name in _BACKWARD_BOOKKEEPING:
            return _NoEffectMethodVariable(name)
        if name == "needs_input_grad":
            from .containers import TupleVariable

            return TupleVariable([ConstantVariable(False)] * self.num_inputs)
        raise Unsupported(f"ctx.{name} in an inlined autograd.Function forward")

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        self.attrs[name] = value

    def python_type(self) -> type:
        return torch.autograd.function.FunctionCtx

    def reconstruct(self, codegen: Any):
        raise Unsupported("an autograd.Function ctx outlives its forward")

    def describe(self) -> str:
        return "InlinedFunctionCtxVariable()"


class _NoEffectMethodVariable(VariableTracker):
    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def call_function(self, tx, args, kwargs) -> VariableTracker:
        return ConstantVariable(None)

    def describe(self) -> str:
        return f"ctx.{self.name}"
