"""``torch.nn.Module`` instances.

Leaf modules that torch defines (Linear, ReLU, Dropout, Conv2d, ...) become ``call_module``
nodes on the GraphModule root, which holds the very same module objects.  Containers
(Sequential, ModuleList, ModuleDict) are unrolled; a user-defined module's ``forward`` is
inlined.  Every module reached is guarded by NN_MODULE (identity + ``training``)."""

from __future__ import annotations

import inspect
import types
from typing import Any

from torch import nn

from ...exc import Unsupported
from ...guards import GuardKind
from ...sources import AttrSource, GetItemSource
from .base import NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList,
               nn.ParameterDict)


def is_leaf_module(module: nn.Module) -> bool:
    """Modules whose ``forward`` torch itself defines (Linear, ReLU, Dropout, ... and user
    subclasses that keep that forward), other than containers, are called as one node."""
    if isinstance(module, _CONTAINERS):
        return False
    forward = getattr(type(module), "forward", None)
    mod = getattr(forward, "__module__", None) or ""
    return mod.startswith("torch.nn.")


def _has_hooks(module: nn.Module) -> bool:
    from torch.nn.modules import module as module_mod

    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None)
                or module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks
                or module_mod._global_backward_hooks
                or getattr(module_mod, "_global_backward_pre_hooks", None))


@tracker_for(nn.Module)
class NNModuleVariable(VariableTracker):
    def __init__(self, module: nn.Module, *, source):
        super().__init__(source=source)
        self.module = module

    @classmethod
    def wrap(cls, builder, value):
        if builder.source is None:
            raise Unsupported(f"module {type(value).__qualname__} without a source")
        builder.install_guard(GuardKind.NN_MODULE, (id(value), bool(value.training)),
                              what="module")
        return cls(value, source=builder.source)

    def python_type(self) -> type:
        return type(self.module)

    def describe(self) -> str:
        return f"NNModuleVariable({type(self.module).__qualname__} at {self.source.name()})"

    # -- attributes -------------------------------------------------------------------

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .functions import UserFunctionVariable, UserMethodVariable

        m = self.module
        src = AttrSource(self.source, name)
        d = m.__dict__
        if name in d.get("_parameters", {}):
            p = d["_parameters"][name]
            if p is None:
                return ConstantVariable(None)
            return tx.output.register_attr_tensor(src, p)
        if name in d.get("_buffers", {}):
            b = d["_buffers"][name]
            if b is None:
                return ConstantVariable(None)
            return tx.output.register_attr_tensor(src, b)
        if name in d.get("_modules", {}):
            sub = d["_modules"][name]
            if sub is None:
                return ConstantVariable(None)
            return tx.wrap_value(sub, src)
        if name in d:
            return tx.wrap_value(d[name], src)
        try:
            static = inspect.getattr_static(type(m), name)
        except AttributeError:
            raise Unsupported(f"{type(m).__qualname__} has no attribute {name!r}") from None
        if isinstance(static, types.FunctionType):
            return UserMethodVariable(static, self, source=src)
        if isinstance(static, property) and isinstance(static.fget, types.FunctionType):
            return UserFunctionVariable(static.fget).call_function(tx, [self], {})
        if isinstance(static, staticmethod):
            return tx.wrap_value(static.__func__, None)
        if isinstance(static, classmethod):
            raise Unsupported(f"classmethod {type(m).__qualname__}.{name}")
        return tx.wrap_value(getattr(m, name), src)

    # -- calling ----------------------------------------------------------------------

    def call_function(self, tx, args, kwargs):
        from .functions import UserMethodVariable

        m = self.module
        if _has_hooks(m):
            raise Unsupported(f"calling {type(m).__qualname__} with hooks registered")
        if "forward" in m.__dict__:
            raise Unsupported(f"{type(m).__qualname__} with an instance-level forward")
        if is_leaf_module(m):
            target = tx.output.register_module(self.source, m)
            return tx.output.create_graph_op("call_module", target, list(args), dict(kwargs))
        if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
            if len(args) != 1 or kwargs:
                raise Unsupported("nn.Sequential called with more than one argument")
            x = args[0]
            for child in self.children(tx):
                x = child.call_function(tx, [x], {})
            return x
        forward = inspect.getattr_static(type(m), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(m).__qualname__}.forward is not a Python function")
        return UserMethodVariable(forward, self, source=AttrSource(self.source, "forward")) \
            .call_function(tx, args, kwargs)

    # -- containers -------------------------------------------------------------------

    def children(self, tx) -> list[VariableTracker]:
        m = self.module
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            return [tx.wrap_value(child, GetItemSource(self.source, i))
                    for i, child in enumerate(m)]
        if isinstance(m, nn.ModuleDict):
            return [ConstantVariable(k) for k in m.keys()]
        raise Unsupported(f"iterating over {type(m).__qualname__}")

    def has_unpack_var_sequence(self, tx) -> bool:
        return isinstance(self.module, (nn.Sequential, nn.ModuleList, nn.ModuleDict))

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return self.children(tx)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        m = self.module
        try:
            idx = index.as_python_constant()
        except NotConstant:
            raise Unsupported("indexing a module container with a non-constant") from None
        if isinstance(m, (nn.Sequential, nn.ModuleList)) and isinstance(idx, int):
            n = len(m)
            if not -n <= idx < n:
                raise Unsupported(f"index {idx} out of range for {type(m).__qualname__}")
            return tx.wrap_value(m[idx], GetItemSource(self.source, idx % n))
        if isinstance(m, nn.ModuleDict) and isinstance(idx, str):
            return tx.wrap_value(m[idx], GetItemSource(self.source, idx))
        raise Unsupported(f"{type(m).__qualname__}[{idx!r}]")

    def as_python_constant(self) -> Any:
        raise NotConstant("module")

