"""``torch.nn.Module`` instances.

Leaf modules that torch defines (Linear, ReLU, Dropout, Conv2d, ...) become ``call_module``
nodes on the GraphModule root, which holds the very same module objects (at run time the
node calls the module; its hook dicts are guarded, because a compiling backend bakes the
forward in and a hook added later would not run).  Containers (Sequential, ModuleList,
ModuleDict, ParameterList, ParameterDict) are unrolled; a user-defined module's ``forward``
is inlined, its parameters and buffers are ``get_attr`` nodes.  Every module reached is
guarded by NN_MODULE (identity + ``training``).

Forward hooks and pre-hooks of a module are inlined around its forward (a leaf module with
hooks is then inlined too, so they do not run twice); a module whose forward is inlined gets
DICT_KEYS guards on its hook dicts, so adding or removing a hook later recompiles.  Backward
hooks and global module hooks are graph breaks (the call runs in Python)."""

from __future__ import annotations

import inspect
import types
from typing import Any

from torch import nn

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from ...sources import AttrSource, GetItemSource, NNModuleMemberSource, Source
from .attributes import AttributeOwner
from .base import BoundMethodVariable, NotConstant, VariableTracker, constant_or_break, tracker_for
from .constant import ConstantVariable

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList,
               nn.ParameterDict)

#: per-module hook dicts guarded (by their keys) when a module's forward is inlined
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks",
               "_backward_pre_hooks")

#: methods of nn.Module / containers evaluated on the real module (their results are
#: submodules, parameters, buffers or names, all reachable through attribute sources)
_NAMED_METHODS = {
    "children": "named_children", "named_children": "named_children",
    "modules": "named_modules", "named_modules": "named_modules",
    "parameters": "named_parameters", "named_parameters": "named_parameters",
    "buffers": "named_buffers", "named_buffers": "named_buffers",
}
_DICT_METHODS = ("keys", "values", "items")


def _lists_tensors(module: nn.Module, method: str) -> bool:
    """Whether ``module.<method>()`` yields parameters or buffers (which inside
    ``functional_call`` are the given tensors, not these); modules and children are safe
    there: their attributes are read through the call's overrides."""
    if method in _DICT_METHODS:
        return not isinstance(module, (nn.ModuleDict, nn.ModuleList, nn.Sequential))
    return _NAMED_METHODS[method] in ("named_parameters", "named_buffers")


def is_leaf_module(module: nn.Module) -> bool:
    """Modules whose ``forward`` torch itself defines (Linear, ReLU, Dropout, ... and user
    subclasses that keep that forward), other than containers, are called as one node. A
    module with no forward at all (a helper holding state and methods, as transformers'
    FunnelAttentionStructure) is never called, so it is no leaf: its methods are inlined and
    its attributes may be set."""
    if isinstance(module, _CONTAINERS):
        return False
    forward = getattr(type(module), "forward", None)
    if forward is nn.Module.forward:  # torch's _forward_unimplemented
        return False
    mod = getattr(forward, "__module__", None) or ""
    return mod.startswith("torch.nn.")


def _global_hooks() -> bool:
    from torch.nn.modules import module as module_mod

    return bool(module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks
                or module_mod._global_backward_hooks
                or getattr(module_mod, "_global_backward_pre_hooks", None))


def _has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _has_backward_hooks(module: nn.Module) -> bool:
    return bool(module._backward_hooks or getattr(module, "_backward_pre_hooks", None))


def member_source(base: Source, module: nn.Module, name: str) -> Source:
    """The source of submodule/parameter/buffer ``name`` of ``module`` (at ``base``)."""
    for table in ("_modules", "_parameters", "_buffers"):
        if name in module.__dict__.get(table, {}):
            return NNModuleMemberSource(base, name, table)
    return AttrSource(base, name)


def path_source(base: Source, module: nn.Module, dotted: str) -> Source:
    """``base.a.b.0`` (a dotted path from ``named_modules``/``named_parameters``)."""
    src = base
    if dotted:
        for part in dotted.split("."):
            src = member_source(src, module, part)
            module = getattr(module, part)
    return src


def guard_module_tables(tx, source: Source, module: nn.Module, tables: tuple[str, ...]) -> None:
    """DICT_KEYS on ``module.<table>`` for each table: what was enumerated (children,
    parameters in their order, container members) must still be exactly these names."""
    from .builder import VariableBuilder

    for table in tables:
        d = module.__dict__.get(table)
        if d is not None:
            VariableBuilder(tx, AttrSource(source, table)).install_guard(
                GuardKind.DICT_KEYS, (type(d), tuple(d.keys())))


#: the tables whose keys each named_* method's result depends on (in every module visited)
_NAMED_TABLES = {
    "named_children": ("_modules",), "named_modules": ("_modules",),
    "named_parameters": ("_modules", "_parameters"), "named_buffers": ("_modules", "_buffers"),
}


def wrap_module_member(tx, source: Source, value: Any) -> VariableTracker:
    """A submodule, parameter or buffer reached at ``source``."""
    import torch

    if isinstance(value, torch.Tensor):
        return tx.output.register_attr_tensor(source, value)
    return tx.wrap_value(value, source)


@upper.provide
@tracker_for(nn.Module)
class NNModuleVariable(AttributeOwner, VariableTracker):
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
        from .attributes import load_attribute

        override = tx.output.state_overrides.get((id(self.module), name))
        if override is not None:  # inside torch.func.functional_call
            return override
        return load_attribute(tx, self, name)

    # AttributeOwner hooks (attributes.py has the lookup order) ---------------------------

    def lookup_class(self) -> type:
        return type(self.module)

    def lookup_instance(self, tx, name: str):
        from .attributes import MISSING, namespace_view

        view = namespace_view(tx, self)
        if view is not None:  # the frame holds (and may have changed) self.__dict__
            return view.items.get(name, MISSING)
        d = self.module.__dict__
        if name not in d:
            return MISSING
        return tx.wrap_value(d[name], AttrSource(self.source, name))

    def lookup_method(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        from .functions import method_of_class

        m = self.module
        if name in _NAMED_METHODS and fn is getattr(nn.Module, name, None):
            return ModuleMethodVariable(self, name)
        if name in _DICT_METHODS and isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            base = nn.ModuleDict if isinstance(m, nn.ModuleDict) else nn.ParameterDict
            if fn is getattr(base, name):
                return ModuleMethodVariable(self, name)
        return method_of_class(tx, fn, self, AttrSource(self.source, name))

    def lookup_class_member(self, tx, name: str, value: Any, klass: type) -> VariableTracker:
        return tx.wrap_value(value, AttrSource(self.source, name))

    def lookup_classmethod(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        from .functions import method_of_class
        from .misc import wrap_class

        return method_of_class(tx, fn, wrap_class(type(self.module)),
                               AttrSource(self.source, name))

    def lookup_real(self, tx, name: str, why: str) -> VariableTracker:
        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise Unsupported(f"{type(self.module).__qualname__} has no attribute {name!r}") \
                from None
        return tx.wrap_value(value, AttrSource(self.source, name))

    def lookup_getattr_fallback(self, tx, name: str, fallback: Any) -> VariableTracker:
        """``nn.Module.__getattr__``: the parameter, buffer or submodule tables (reached
        only when the class and the instance dict have no ``name``); a class's own
        ``__getattr__`` runs on the real module (the guard re-reads it)."""
        if fallback is not nn.Module.__getattr__:
            return self.lookup_real(tx, name, "its class defines __getattr__")
        return self.module_table_member(tx, name)

    def slot_method(self, tx, attr: Any) -> VariableTracker | None:
        call_stage = _CALL_STAGES.get(attr)
        if call_stage is not None:  # super().__call__(...) in an override
            return ModuleCallStageVariable(self, call_stage)
        if attr is nn.Module.__getattr__:
            from .attributes import AttributeSlotVariable

            return AttributeSlotVariable(self, "nn.Module.__getattr__", self.module_table_member)
        return super().slot_method(tx, attr)

    def module_table_member(self, tx, name: str) -> VariableTracker:
        d = self.module.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            members = d.get(table, {})
            if name not in members:
                continue
            value = members[name]
            if value is None:
                return ConstantVariable(None)
            if table == "_modules":
                return tx.wrap_value(value, NNModuleMemberSource(self.source, name))
            return tx.output.register_attr_tensor(
                NNModuleMemberSource(self.source, name, table), value)
        raise Unsupported(f"{type(self.module).__qualname__} has no attribute {name!r}")

    def store_attr(self, tx, name: str, value: VariableTracker) -> None:
        """``self.name = value``: nn.Module.__setattr__ sends parameters, submodules and
        table members to its tables, and anything else to object.__setattr__, which calls
        a property's setter (inlined here) before writing the instance dict; stores are
        recorded and replayed after the graph."""
        import torch

        from .attributes import MISSING, data_descriptor_setter, store_through_descriptor

        d = self.module.__dict__
        in_table = any(name in d.get(t, {}) for t in ("_parameters", "_buffers", "_modules"))
        real = getattr(value, "module", getattr(value, "value", None))
        if in_table or isinstance(real, (nn.Module, torch.nn.Parameter)):
            tx.output.side_effects.store_attr(tx, self, name, value)
            return
        if store_through_descriptor(tx, self, type(self.module), name, value):
            return
        if data_descriptor_setter(type(self.module), name) is not MISSING:
            raise Unsupported(f"assignment to {name!r} of {self.describe()} (a data "
                              "descriptor)")
        tx.output.side_effects.store_attr(tx, self, name, value)

    # -- calling ----------------------------------------------------------------------

    def call_function(self, tx, args, kwargs):
        """``module(*args)`` is ``type(module).__call__``: nn.Module's runs ``_call_impl``
        (hooks around ``forward``); a class that overrides either has its own inlined."""
        from .attributes import class_attribute

        cls = type(self.module)
        call, _ = class_attribute(cls, "__call__")
        forwarder = _CALL_FORWARDERS.get(getattr(call, "__code__", None))
        if forwarder is not None:
            call = forwarder(self.module)
        if call is not nn.Module.__call__:
            return self.call_override(tx, "__call__", call, args, kwargs)
        return self.wrapped_call_impl(tx, args, kwargs)

    def call_override(self, tx, name: str, fn: Any, args, kwargs) -> VariableTracker:
        from .functions import method_of_pinned_class

        if not isinstance(fn, types.FunctionType):
            raise Unsupported(f"{type(self.module).__qualname__}.{name} is not a Python "
                              "function")
        # (special methods are looked up on the class, so the class member is guarded)
        return method_of_pinned_class(tx, type(self.module), name, fn, self).call_function(
            tx, list(args), dict(kwargs))

    def wrapped_call_impl(self, tx, args, kwargs) -> VariableTracker:
        """``nn.Module.__call__``: ``self._call_impl(...)``, an attribute lookup like any
        other (an instance or a class may override it)."""
        if "_call_impl" in self.module.__dict__ or \
                type(self.module)._call_impl is not nn.Module._call_impl:
            return tx.call_function(self.var_getattr(tx, "_call_impl"), list(args),
                                    dict(kwargs))
        return self.call_impl(tx, args, kwargs)

    def call_impl(self, tx, args, kwargs) -> VariableTracker:
        """``nn.Module._call_impl``: hooks around ``forward`` (or one call_module node)."""
        m = self.module
        if _global_hooks():
            raise Unsupported("global nn.Module hooks are registered")
        if _has_backward_hooks(m):
            raise Unsupported(f"calling {type(m).__qualname__} with backward hooks registered")
        instance_forward = "forward" in m.__dict__
        if is_leaf_module(m) and not instance_forward and not _has_forward_hooks(m) and \
                not tx.output.state_overrides:  # (functional_call: inline, read overrides)
            # call_module. A backend that compiles the graph bakes this module's forward in,
            # so hooks registered later must recompile: guard the (empty) hook dicts too
            self.install_hook_guards(tx)
            target = tx.output.register_module(self.source, m)
            return tx.output.create_graph_op("call_module", target, list(args), dict(kwargs))
        self.install_hook_guards(tx)
        args, kwargs = self.run_pre_hooks(tx, list(args), dict(kwargs))
        out = self.call_forward(tx, args, kwargs, instance_forward)
        return self.run_post_hooks(tx, args, kwargs, out)

    def install_hook_guards(self, tx) -> None:
        """DICT_KEYS on the hook dicts: the inlined code assumed exactly these hooks."""
        from .builder import VariableBuilder

        for dname in _HOOK_DICTS:
            hooks = self.module.__dict__.get(dname)
            if hooks is None:
                continue
            VariableBuilder(tx, AttrSource(self.source, dname)).install_guard(
                GuardKind.DICT_KEYS, (type(hooks), tuple(hooks.keys())))

    def _hook(self, tx, dname: str, key: Any) -> VariableTracker:
        hook = getattr(self.module, dname)[key]
        return tx.wrap_value(hook, GetItemSource(AttrSource(self.source, dname), key))

    def run_pre_hooks(self, tx, args, kwargs):
        from .containers import BaseSequenceVariable, ConstDictVariable, TupleVariable

        m = self.module
        with_kwargs = getattr(m, "_forward_pre_hooks_with_kwargs", {})
        for key in list(m._forward_pre_hooks):
            hook = self._hook(tx, "_forward_pre_hooks", key)
            if key in with_kwargs:
                res = tx.call_function(hook, [self, TupleVariable(list(args)),
                                              ConstDictVariable(dict(kwargs))], {})
                if _is_none(res):
                    continue
                parts = tx.unpack_sequence(res)
                if len(parts) != 2 or not isinstance(tx.realize(parts[1]), ConstDictVariable):
                    raise Unsupported("forward pre-hook with kwargs must return (args, kwargs)")
                args = tx.unpack_sequence(parts[0])
                kwargs = dict(tx.realize(parts[1]).items)
            else:
                res = tx.call_function(hook, [self, TupleVariable(list(args))], {})
                if _is_none(res):
                    continue
                res = tx.realize(res)
                args = list(res.items) if isinstance(res, BaseSequenceVariable) and \
                    res.python_type() is tuple else [res]
        return args, kwargs

    def run_post_hooks(self, tx, args, kwargs, out):
        from .containers import ConstDictVariable, TupleVariable

        m = self.module
        with_kwargs = getattr(m, "_forward_hooks_with_kwargs", {})
        for key in list(m._forward_hooks):
            hook = self._hook(tx, "_forward_hooks", key)
            if key in with_kwargs:
                res = tx.call_function(hook, [self, TupleVariable(list(args)),
                                              ConstDictVariable(dict(kwargs)), out], {})
            else:
                res = tx.call_function(hook, [self, TupleVariable(list(args)), out], {})
            if not _is_none(res):
                out = res
        return out

    def call_forward(self, tx, args, kwargs, instance_forward: bool):
        from .functions import method_of_class

        m = self.module
        if instance_forward:
            fn = tx.wrap_value(m.__dict__["forward"], AttrSource(self.source, "forward"))
            return tx.call_function(fn, args, kwargs)
        if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
            if len(args) != 1 or kwargs:
                raise Unsupported("nn.Sequential called with more than one argument")
            x = args[0]
            for child in self.members(tx):
                x = tx.call_function(child, [x], {})
            return x
        forward = inspect.getattr_static(type(m), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(m).__qualname__}.forward is not a Python function")
        return method_of_class(tx, forward, self, AttrSource(self.source, "forward")) \
            .call_function(tx, args, kwargs)

    # -- containers -------------------------------------------------------------------

    def guard_structure(self, tx) -> None:
        """The container's members (their names, order and number) are what was traced."""
        table = "_parameters" if isinstance(self.module, (nn.ParameterList, nn.ParameterDict)) \
            else "_modules"
        guard_module_tables(tx, self.source, self.module, (table,))

    def members(self, tx) -> list[VariableTracker]:
        m = self.module
        self.guard_structure(tx)
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            return [tx.wrap_value(child, NNModuleMemberSource(self.source, key))
                    for key, child in m._modules.items()]
        if isinstance(m, nn.ParameterList):
            return [tx.output.register_attr_tensor(member_source(self.source, m, str(i)), p)
                    for i, p in enumerate(m)]
        if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            return [ConstantVariable(k) for k in m.keys()]
        raise Unsupported(f"iterating over {type(m).__qualname__}")

    def has_unpack_var_sequence(self, tx) -> bool:
        return isinstance(self.module, _CONTAINERS)

    def contains(self, tx, item: VariableTracker) -> VariableTracker:
        """``key in module_dict`` on the guarded keys; ``m in module_list`` by identity
        among its members (what iterating and ``==`` on modules decide)."""
        m = self.module
        dict_base = next((b for b in (nn.ModuleDict, nn.ParameterDict) if isinstance(m, b)),
                         None)
        list_base = next((b for b in (nn.Sequential, nn.ModuleList) if isinstance(m, b)), None)
        if dict_base is not None and type(m).__contains__ is dict_base.__contains__:
            if not item.is_python_constant():
                raise Unsupported(f"`in` on a {type(m).__qualname__} with a non-constant key")
            self.guard_structure(tx)
            return ConstantVariable(item.as_python_constant() in m)
        if list_base is not None and type(m).__iter__ is list_base.__iter__ and \
                getattr(type(m), "__contains__", None) is None:
            from .containers import TupleVariable
            from .operators import contains_op

            return contains_op(tx, TupleVariable(self.members(tx)), item)
        raise Unsupported(f"`in` on a {type(m).__qualname__}")

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return self.members(tx)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        m = self.module
        idx = constant_or_break(index, "indexing a module container with a non-constant")
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ParameterList)):
            items = self.members(tx)
            if isinstance(idx, slice):
                return ModuleSliceVariable(self, idx, items[idx])
            if isinstance(idx, int):
                n = len(items)
                if not -n <= idx < n:
                    raise Unsupported(f"index {idx} out of range for {type(m).__qualname__}")
                return items[idx]
        self.guard_structure(tx)
        if isinstance(m, nn.ModuleDict) and isinstance(idx, str) and idx in m:
            return tx.wrap_value(m[idx], NNModuleMemberSource(self.source, idx))
        if isinstance(m, nn.ParameterDict) and isinstance(idx, str) and idx in m:
            return tx.output.register_attr_tensor(member_source(self.source, m, idx), m[idx])
        raise Unsupported(f"{type(m).__qualname__}[{idx!r}]")

    def as_python_constant(self) -> Any:
        raise NotConstant("module")

    def truth_value(self, tx) -> bool:
        """``bool(module)`` (``if self.downsample:``): a container's is its length (its
        structure guarded), any other module's is True unless its class defines
        ``__bool__``/``__len__`` (the class is fixed by the module's identity guard)."""
        if isinstance(self.module, _CONTAINERS):
            self.guard_structure(tx)
            return len(self.module) != 0
        cls = type(self.module)
        if getattr(cls, "__bool__", None) is None and getattr(cls, "__len__", None) is None:
            return True
        raise Unsupported(f"truth value of {self.describe()} (its class defines __bool__ or "
                          "__len__)")


def _graph_module_call(module: nn.Module) -> Any:
    """``GraphModule.recompile`` installs ``call_wrapped`` as its class's ``__call__``: it
    runs the class's own ``__call__`` if it had one (``_wrapped_call.cls_call``), else
    nn.Module's (adding only a nicer traceback)."""
    return getattr(type(module)._wrapped_call, "cls_call", None) or nn.Module.__call__


def _call_forwarders() -> dict[types.CodeType, Any]:
    """``__call__`` implementations of torch that only forward to another, by code (they
    are made anew for each class): what they forward to, given the module."""
    from torch.fx import GraphModule

    out: dict[types.CodeType, Any] = {}
    for const in GraphModule.recompile.__code__.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == "call_wrapped":
            out[const] = _graph_module_call
    return out


_CALL_FORWARDERS = _call_forwarders()

#: nn.Module's own call stages, as ``super().__call__``/``super()._call_impl`` reach them
_CALL_STAGES = {nn.Module.__call__: "wrapped_call_impl", nn.Module._call_impl: "call_impl"}


class ModuleCallStageVariable(BoundMethodVariable):
    """``nn.Module.__call__`` or ``nn.Module._call_impl`` bound to a module (what an
    override's ``super().__call__(...)`` calls); ``name`` is the NNModuleVariable method
    that runs the stage."""

    module_var = property(lambda self: self.obj, doc="the NNModuleVariable it is bound to")
    stage = property(lambda self: self.name, doc="the NNModuleVariable method to run")

    def describe(self) -> str:
        return f"ModuleCallStageVariable({self.stage} of {self.module_var.describe()})"

    def call_function(self, tx, args, kwargs):
        return getattr(self.module_var, self.stage)(tx, list(args), dict(kwargs))


def _is_none(v: VariableTracker) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


class ModuleMethodVariable(BoundMethodVariable):
    """``module.children`` / ``named_parameters`` / ``ModuleDict.items`` ...: evaluated on
    the real module at trace time (its structure is fixed by the NN_MODULE guards), each
    result reached through an attribute source."""

    module_var = property(lambda self: self.obj, doc="the NNModuleVariable it is bound to")

    def describe(self) -> str:
        return f"ModuleMethodVariable({self.name})"

    def call_function(self, tx, args, kwargs):
        from .containers import ListIteratorVariable, TupleVariable

        mv = self.module_var
        m = mv.module
        if tx.output.state_overrides and _lists_tensors(m, self.name):
            raise Unsupported(f"module.{self.name}() inside torch.func.functional_call "
                              "(would list the real parameters)")
        try:
            cargs = [a.as_python_constant() for a in args]
            ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        except NotConstant:
            raise Unsupported(f"module.{self.name}() with non-constant arguments") from None
        if self.name in _DICT_METHODS:
            if cargs or ckwargs:
                raise Unsupported(f"{type(m).__qualname__}.{self.name} with arguments")
            mv.guard_structure(tx)
            keys = list(m.keys())
            if isinstance(m, nn.ModuleDict):
                values = [tx.wrap_value(m[k], NNModuleMemberSource(mv.source, k)) for k in keys]
            else:
                values = [tx.output.register_attr_tensor(member_source(mv.source, m, k), m[k])
                          for k in keys]
            if self.name == "keys":
                return ListIteratorVariable([ConstantVariable(k) for k in keys])
            if self.name == "values":
                return ListIteratorVariable(values)
            return ListIteratorVariable([TupleVariable([ConstantVariable(k), v])
                                         for k, v in zip(keys, values, strict=True)])
        named_method = _NAMED_METHODS[self.name]
        for path, sub in m.named_modules(remove_duplicate=False):
            guard_module_tables(tx, path_source(mv.source, m, path), sub,
                                _NAMED_TABLES[named_method])
        named = getattr(m, named_method)(*cargs, **ckwargs)
        prefix = ckwargs.get("prefix", "")
        items = []
        for path, obj in named:
            rel = path[len(prefix) + 1:] if prefix and path.startswith(prefix + ".") else (
                "" if prefix and path == prefix else path)
            value = wrap_module_member(tx, path_source(mv.source, m, rel), obj) if rel else mv
            if self.name.startswith("named_"):
                items.append(TupleVariable([ConstantVariable(path), value]))
            else:
                items.append(value)
        return ListIteratorVariable(items)


class ModuleSliceVariable(VariableTracker):
    """``seq[a:b]`` of a Sequential/ModuleList/ParameterList: a new container at run time;
    here the list of the selected members (calling a Sequential slice chains them)."""

    def __init__(self, container: NNModuleVariable, index: slice,
                 items: list[VariableTracker]):
        super().__init__()
        self.container = container
        self.index = index
        self.items = list(items)
        self.module = container.module[index]

    def children(self):
        return [self.container]

    def python_type(self) -> type:
        return type(self.module)

    def describe(self) -> str:
        return f"ModuleSliceVariable({self.container.describe()}[{self.index}])"

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return list(self.items)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        idx = constant_or_break(index, "indexing a module container with a non-constant")
        if isinstance(idx, slice):
            return ModuleSliceVariable(self.container, _compose(self.index, idx,
                                                                len(self.container.module)),
                                       self.items[idx])
        try:
            return self.items[idx]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"{type(e).__name__} indexing a module slice") from e

    def call_function(self, tx, args, kwargs):
        if not isinstance(self.module, nn.Sequential) or \
                type(self.module).forward is not nn.Sequential.forward:
            raise Unsupported(f"calling a slice of {type(self.module).__qualname__}")
        if len(args) != 1 or kwargs:
            raise Unsupported("nn.Sequential called with more than one argument")
        x = args[0]
        for child in self.items:
            x = tx.call_function(child, [x], {})
        return x

    def reconstruct(self, codegen):
        codegen(self.container)
        codegen.load_const(self.index)
        codegen.binary_subscr()


def _compose(outer: slice, inner: slice, n: int) -> slice:
    """The slice equal to ``[outer][inner]`` on a sequence of length ``n``."""
    idx = list(range(n))[outer][inner]
    if not idx:
        return slice(0, 0)
    step = idx[1] - idx[0] if len(idx) > 1 else 1
    stop = idx[-1] + step
    return slice(idx[0], stop if stop >= 0 else None, step)
