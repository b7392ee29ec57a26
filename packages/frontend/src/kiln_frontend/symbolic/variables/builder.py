"""VariableBuilder: turns a real object found through a ``Source`` into a tracker, using the
``@tracker_for`` registry, and records the guards that make the tracker valid."""

from __future__ import annotations

import sys
import types
from typing import Any

from ...guards import Guard, GuardKind, identity_guards
from ...layers import upper
from ...sources import AttrSource, Source
from .base import Translator, VariableTracker, lookup_tracker


class VariableBuilder:
    def __init__(self, tx: Translator, source: Source | None, *,
                 guard: bool = True):
        self.tx = tx
        self.source = source
        self.guard = guard

    def install_guard(self, kind: GuardKind, expected: Any = None, *, what: str = "") -> None:
        if self.guard and self.source is not None:
            self.tx.output.guards.add(Guard(self.source, kind, expected, what))

    def install_identity_guard(self, value: Any, kind: GuardKind = GuardKind.FUNCTION_MATCH,
                               *, what: str = "") -> None:
        """``source`` still gives ``value``: ID_MATCH/FUNCTION_MATCH, or for a bound method
        (a new object at each access) its type, ``__self__`` and function
        (``guards.identity_guards``)."""
        if self.guard and self.source is not None:
            for guard in identity_guards(self.source, value, kind, what):
                self.tx.output.guards.add(guard)

    def child(self, source: Source | None) -> VariableBuilder:
        return VariableBuilder(self.tx, source, guard=self.guard)

    def __call__(self, value: Any) -> VariableTracker:
        output = self.tx.output
        if self.source is not None:
            cached = output.source_cache.get(self.source)
            if cached is not None:
                return cached
        vt = output.tracker_for_object(value)
        if vt is not None:
            # the same object reached through another source: one tracker, so a mutation
            # recorded through either alias is seen through both
            self._guard_alias(vt)
        else:
            vt = self._wrap(value)
            if self.source is not None:
                output.remember_object(value, vt)
        if self.source is not None:
            output.source_cache[self.source] = vt
        return vt

    def _guard_alias(self, vt: VariableTracker) -> None:
        """The tracker assumes ``self.source`` and ``vt.source`` are one object: guard it."""
        from ...sources import IdentitySource

        if self.guard and self.source is not None and vt.source is not None and \
                self.source != vt.source:
            self.tx.output.guards.add(Guard(IdentitySource(self.source, vt.source),
                                            GuardKind.CONSTANT_MATCH, True,
                                            what="aliased object"))

    def _wrap(self, value: Any) -> VariableTracker:
        import torch

        from .functions import UserMethodVariable
        from .misc import UserDefinedObjectVariable
        from .torch import (
            TORCH_SPECIAL_FUNCTIONS,
            TorchFunctionVariable,
            TorchSpecialFunctionVariable,
            is_member,
            is_torch_callable,
        )

        def _is_special(v):  # by identity: never a user object's own __hash__
            return is_member(v, TORCH_SPECIAL_FUNCTIONS)

        if isinstance(value, torch.Tensor) and self.source is None:
            # a tensor reachable from nowhere in the frame (a default argument, a closure
            # cell of a function made elsewhere): give it a global so code can reload it
            name = self.tx.output.install_global_object("tensor", value)
            from ...sources import GlobalSource

            return VariableBuilder(self.tx, GlobalSource(name), guard=self.guard)(value)
        if isinstance(value, types.MethodType) and isinstance(value.__func__,
                                                              types.FunctionType):
            self_src = AttrSource(self.source, "__self__") if self.source is not None else None
            obj = self.child(self_src)(value.__self__)
            if self.source is not None:  # the method itself (not its identity: a new one
                # at every access) is guarded through its function
                self.child(AttrSource(self.source, "__func__")).install_guard(
                    GuardKind.ID_MATCH, id(value.__func__), what="function of a method")
            return UserMethodVariable(value.__func__, obj, source=self.source)
        if _is_special(value):
            return TorchSpecialFunctionVariable(value, source=self.source)
        inline = getattr(value, "_torchdynamo_inline", None) \
            if isinstance(value, torch.jit.ScriptFunction) else None
        if inline is not None:
            # ``torch.jit.script`` keeps the Python function it compiled: trace that (as
            # torch.compile does), guarded through the attribute, rather than graph-break
            # at every call of the opaque TorchScript function
            src = AttrSource(self.source, "_torchdynamo_inline") if self.source is not None \
                else None
            return self.child(src)(inline)
        from .distributed import wrap_distributed

        distributed = wrap_distributed(self, value)  # a mesh, a placement, DTensor.from_local
        if distributed is not None:
            return distributed
        from ..hops import hop_tracker

        hop = hop_tracker(self, value)
        if hop is not None:
            return hop
        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(self, value)
        from .deepcopy import PYTHON_FUNCTION_HANDLERS, HandledFunctionVariable

        if isinstance(value, types.FunctionType) and value in PYTHON_FUNCTION_HANDLERS:
            return HandledFunctionVariable.wrap(self, value)
        from .numpy_arrays import NumpyFunctionVariable, is_numpy_function

        if is_numpy_function(value):
            return NumpyFunctionVariable.wrap(self, value)
        tracker = lookup_tracker(value)
        if tracker is None or is_module_namespace(value):
            # anything else is an opaque object: loading it always works (so a frame can
            # be resumed with it); using it is what graph-breaks
            return UserDefinedObjectVariable.wrap(self, value)
        return tracker.wrap(self, value)


def is_module_namespace(value: Any) -> bool:
    """A module's ``__dict__`` (``globals()``, ``vars(module)``) is opaque, never a dict
    tracker: its keys change under the frame's feet (kiln itself installs compiled
    functions and resume functions there), so a guard on them fails at once, and what a
    frame reads from it is read through global sources instead."""
    if type(value) is not dict:
        return False
    module = sys.modules.get(value.get("__name__")) if isinstance(value.get("__name__"), str) \
        else None
    return module is not None and getattr(module, "__dict__", None) is value


def has_identity(vt: VariableTracker) -> bool:
    """Whether ``vt`` stands for an object whose identity matters while tracing: one the
    frame can mutate (a list, dict, set, user object, module, Python module) or a tensor
    (one graph value per tensor). Such an object gets one tracker per trace."""
    from .containers import ConstDictVariable, ListVariable, SetVariable
    from .misc import UserDefinedObjectVariable
    from .tensor import TensorVariable
    from .torch import PythonModuleVariable

    return isinstance(vt, (ListVariable, ConstDictVariable, SetVariable,
                           UserDefinedObjectVariable, upper.NNModuleVariable, PythonModuleVariable,
                           TensorVariable))
