"""SideEffects: what the traced code did to objects that outlive the frame, replayed by the
transformed code after the compiled graph.

While tracing nothing real is touched: a list or dict from the frame (an argument, a global,
an attribute) is mutated only in its tracker (``lst.append(t)`` edits the tracker's items),
an attribute store on an object, a module or a Python module (``self.count = n``,
``cfg.scale = 2``) and a global store (``STORE_GLOBAL``) are recorded here, and later reads
see the recorded value (so no guard is installed on a value the frame itself wrote).

The transformed code then, after calling the graph and before returning (or, at a graph
break, before the instruction that runs in Python), applies them in two phases so that
no rebuilt value can see a half-applied state:

1. load every object to mutate and every new value into temporaries (values read through
   sources, ``L['xs'][0]``, are read before anything changed);
2. apply them, in the order the frame first touched them: ``xs[:] = [...]`` for a list,
   ``d.clear(); d.update({...})`` for a dict, ``obj.name = value`` / ``del obj.name``,
   ``STORE_GLOBAL name``.

Objects the frame created itself (lists, dicts, instances of plain classes) need no replay:
the transformed code builds them with their final contents.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ..bytecode import builders, create_instruction
from ..exc import Unsupported
from .variables.attributes import DELETED
from .variables.base import VariableTracker


@dataclasses.dataclass
class AttrMutations:
    """Attribute stores on one object from the frame (name -> value or DELETED)."""

    obj: VariableTracker
    stores: dict[str, Any] = dataclasses.field(default_factory=dict)


def _real_object(obj: VariableTracker) -> Any:
    for attr in ("value", "module"):
        if hasattr(obj, attr):
            return getattr(obj, attr)
    raise Unsupported(f"assignment to an attribute of {obj.describe()}")


def _check_attr_store(obj: VariableTracker, name: str, value: VariableTracker) -> None:
    """Raise Unsupported unless ``obj.name = value`` can be replayed after the graph as is."""
    import torch

    from .variables.misc import UserDefinedObjectVariable
    from .variables.nn_module import NNModuleVariable, is_leaf_module
    from .variables.torch import PythonModuleVariable

    what = f"assignment to attribute {name!r} of {obj.describe()}"
    from .variables.misc import UserDefinedClassVariable

    if isinstance(obj, UserDefinedClassVariable):
        return _check_class_attr_store(obj.cls, name, value, what)
    if obj.source is None:
        raise Unsupported(f"{what} (an object without a source)")
    if isinstance(obj, PythonModuleVariable):
        if obj.module.__name__.split(".")[0] == "torch":
            raise Unsupported(f"{what} (torch's global state)")
        return
    if isinstance(obj, NNModuleVariable):
        m = obj.module
        if is_leaf_module(m):
            raise Unsupported(f"{what} (the graph calls this module as it is now)")
        if name == "training" or name in m.__dict__.get("_parameters", {}) or \
                name in m.__dict__.get("_modules", {}):
            raise Unsupported(f"{what} (module structure or mode)")
        real = _example_of(value)
        if isinstance(real, (torch.nn.Module, torch.nn.Parameter)):
            raise Unsupported(f"{what} (a module or parameter)")
        return
    if isinstance(obj, UserDefinedObjectVariable):
        cls = type(obj.value)
        if cls.__setattr__ is not object.__setattr__ or \
                type(cls).__setattr__ is not type.__setattr__:
            raise Unsupported(f"{what} (custom __setattr__)")
        try:
            static = inspect.getattr_static(cls, name)
        except AttributeError:
            static = None
        if static is not None and (hasattr(static, "__set__") or hasattr(static, "__delete__")):
            raise Unsupported(f"{what} (a property or slot)")
        if not hasattr(obj.value, "__dict__"):
            raise Unsupported(f"{what} (no __dict__)")
        return
    raise Unsupported(what)


def _check_class_attr_store(cls: type, name: str, value: VariableTracker, what: str) -> None:
    """``Cls.name = value`` is replayed only where every read of it while tracing sees the
    recorded value (``class_store``): a plain value the class itself already holds, replaced
    by another plain value, so no lookup order changes (no descriptor comes or goes, no
    base's entry is shadowed, ``hasattr`` answers as before), on a class whose metaclass
    stores as ``type`` does.  Dunders are refused (slots and the data model read them)."""
    from .variables.attributes import MISSING, class_attribute, is_descriptor

    if type(cls).__setattr__ is not type.__setattr__:
        raise Unsupported(f"{what} (its metaclass defines __setattr__)")
    if name.startswith("__") and name.endswith("__"):
        raise Unsupported(f"{what} (a special name)")
    if cls.__module__.split(".")[0] == "torch":
        raise Unsupported(f"{what} (torch's own class)")
    attr = cls.__dict__.get(name, MISSING)
    if attr is MISSING or is_descriptor(attr):
        raise Unsupported(f"{what} (not a plain value the class itself holds)")
    if class_attribute(type(cls), name)[0] is not MISSING:
        raise Unsupported(f"{what} (its metaclass has that name)")
    try:
        new_type = value.python_type()
    except Unsupported:
        raise Unsupported(f"{what} (a value of unknown type)") from None
    if hasattr(new_type, "__get__") or hasattr(new_type, "__set__"):
        raise Unsupported(f"{what} (a descriptor)")


def _check_no_namespace_view(tx: Any, obj: VariableTracker, name: str) -> None:
    """The frame holds ``obj.__dict__`` as a dict tracker: a store recorded here would not
    show in it (nor its changes here)."""
    from .variables.attributes import namespace_view

    if namespace_view(tx, obj) is not None:
        raise Unsupported(f"assignment to attribute {name!r} of {obj.describe()}, whose "
                          "__dict__ the frame holds")


def _owns(real: Any, name: str) -> bool:
    """``name`` is in the object's own namespace (its ``__dict__``, or a module's
    parameter, buffer and submodule tables): what ``del obj.name`` removes."""
    d = getattr(real, "__dict__", None)
    if not isinstance(d, dict):
        return False
    return name in d or any(name in d.get(t, ()) for t in ("_parameters", "_buffers",
                                                            "_modules"))


def _is_class_tracker(obj: VariableTracker) -> bool:
    from .variables.misc import UserDefinedClassVariable

    return isinstance(obj, UserDefinedClassVariable)


def _example_of(value: VariableTracker) -> Any:
    for attr in ("module", "value"):
        if hasattr(value, attr):
            return getattr(value, attr)
    return None


class SideEffects:
    """The table of one OutputGraph (rebuilt when tracing restarts)."""

    def __init__(self, output: Any):
        self.output = output
        #: id(object tracker) -> its attribute stores, in first-mutation order
        self.attr_mutations: dict[int, AttrMutations] = {}
        #: globals of the frame written with STORE_GLOBAL, in first-write order
        self.global_stores: dict[str, VariableTracker] = {}
        #: id(cell) -> (cell, value): writes to real closure cells (the frame's free
        #: variables, an inlined function's), replayed as ``cell.cell_contents = value``
        self.cell_stores: dict[int, tuple[Any, VariableTracker]] = {}

    # -- while tracing ------------------------------------------------------------------

    def store_attr(self, tx: Any, obj: VariableTracker, name: str,
                   value: VariableTracker) -> None:
        _check_attr_store(obj, name, value)
        _check_no_namespace_view(tx, obj, name)
        self._guard_replaced_buffer(obj, name)
        # a class is reached through many trackers (each load of its name): its stores are
        # keyed by the class itself (its id: alive while traced, so no tracker's id)
        key = id(obj.cls) if _is_class_tracker(obj) else id(obj)
        entry = self.attr_mutations.get(key)
        if entry is None:
            entry = self.attr_mutations[key] = AttrMutations(obj)
        entry.stores.pop(name, None)  # keep the last store's position
        entry.stores[name] = value

    def _guard_replaced_buffer(self, obj: VariableTracker, name: str) -> None:
        """A graph reads a module's buffer as the very tensor it saw (``get_attr``): once
        the frame replaces that buffer, the compiled code is only valid while the module
        still holds the tensor seen at compile time (ID_MATCH on it)."""
        from ..guards import Guard, GuardKind
        from ..sources import AttrSource

        module = getattr(obj, "module", None)
        buffers = getattr(module, "_buffers", None)
        if isinstance(buffers, dict) and buffers.get(name) is not None:
            self.output.guards.add(Guard(AttrSource(obj.source, name), GuardKind.ID_MATCH,
                                         id(buffers[name]), what="buffer"))

    def delete_attr(self, tx: Any, obj: VariableTracker, name: str) -> None:
        frame_delete = getattr(obj, "delete_attr", None)
        if frame_delete is not None:  # an object made by the frame (its own protocol)
            frame_delete(tx, name)
            return
        attrs = getattr(obj, "attrs", None)
        if obj.source is None and isinstance(attrs, dict):  # an object made by the frame
            if name not in attrs:
                raise Unsupported(f"AttributeError: deleting missing attribute {name!r}")
            del attrs[name]
            return
        _check_attr_store(obj, name, obj)
        _check_no_namespace_view(tx, obj, name)
        owned = _owns(_real_object(obj), name)
        entry = self.attr_mutations.get(id(obj))
        stored = entry.stores.get(name) if entry is not None else None
        if stored is None and not owned or stored is DELETED:
            # ``del`` removes an instance entry (or a module's table member) only: one
            # that is not there (a class attribute's name included) raises
            raise Unsupported(f"AttributeError: deleting missing attribute {name!r}")
        if entry is None:
            entry = self.attr_mutations[id(obj)] = AttrMutations(obj)
        entry.stores.pop(name, None)
        if stored is None or owned:
            entry.stores[name] = DELETED
        # (else assigned, then deleted, by the frame: the real object never had it)

    def class_store(self, cls: type, name: str) -> VariableTracker | None:
        """What the frame stored in ``name`` of the class that ``cls`` (or an instance of
        it) reads it from, or None.  Stores only replace a value in the class's own
        ``__dict__`` (``_check_class_attr_store``), so the MRO finds that class as before."""
        if not self.attr_mutations:
            return None
        from .variables.attributes import class_attribute

        _, klass = class_attribute(cls, name)
        entry = self.attr_mutations.get(id(klass)) if klass is not None else None
        if entry is None or not _is_class_tracker(entry.obj) or entry.obj.cls is not klass:
            return None
        return entry.stores.get(name)

    def has_class_stores(self) -> bool:
        return any(_is_class_tracker(e.obj) for e in self.attr_mutations.values())

    def load_attr(self, obj: VariableTracker, name: str) -> VariableTracker | None:
        """The value the frame stored in ``obj.name``, or None when it did not."""
        entry = self.attr_mutations.get(id(obj))
        if entry is None or name not in entry.stores:
            return None
        value = entry.stores[name]
        if value is DELETED:
            raise Unsupported(f"AttributeError: attribute {name!r} was deleted")
        return value

    def store_global(self, tx: Any, name: str, value: VariableTracker) -> None:
        if tx.f_globals is not tx.root().f_globals:
            raise Unsupported(f"assignment to global {name!r} of another module")
        self.global_stores.pop(name, None)
        self.global_stores[name] = value

    def load_global(self, tx: Any, name: str) -> VariableTracker | None:
        if tx.f_globals is not tx.root().f_globals:
            return None
        return self.global_stores.get(name)

    def store_cell(self, cell: Any, value: VariableTracker) -> None:
        """``nonlocal v; v = ...`` on a cell that exists outside the frame: later reads in
        the frame see ``value`` (``load_cell``), the cell gets it after the graph."""
        self.cell_stores.pop(id(cell), None)
        self.cell_stores[id(cell)] = (cell, value)

    def load_cell(self, cell: Any) -> VariableTracker | None:
        entry = self.cell_stores.get(id(cell))
        return None if entry is None else entry[1]

    # -- what changed -------------------------------------------------------------------

    def mutated_containers(self) -> list[VariableTracker]:
        """Lists and dicts from the frame whose tracked contents differ from what they held
        when first mutated (``original_items``, set by ``check_mutable``)."""
        out = []
        seen: set[int] = set()
        for v in list(self.output.source_cache.values()):
            original = getattr(v, "original_items", None)
            if original is None or id(v) in seen:
                continue
            seen.add(id(v))
            if _contents_key(v.items) != _contents_key(original):
                out.append(v)
        return out

    def is_empty(self) -> bool:
        return not (self.attr_mutations or self.global_stores or self.cell_stores or
                    self.mutated_containers())

    def values(self) -> list[VariableTracker]:
        """Every tracker the replay rebuilds (the graph must output the tensors among
        them; mutable ones referenced elsewhere too must stay one object)."""
        out: list[VariableTracker] = []
        for c in self.mutated_containers():
            out.append(c)
            out.extend(c.items.values() if isinstance(c.items, dict) else c.items)
        for entry in self.attr_mutations.values():
            out.extend(v for v in entry.stores.values() if v is not DELETED)
        out.extend(self.global_stores.values())
        out.extend(v for _, v in self.cell_stores.values())
        return out

    # -- code -----------------------------------------------------------------------------

    def guard_no_aliasing(self) -> None:
        """The trace kept one tracker per object it saw; two sources that held distinct
        objects were traced as distinct.  For each object the frame mutated, guard that no
        other traced object of its type is the same object on a later call (else a write
        through one would not be seen through the other: recompile, traced as one)."""
        from ..guards import Guard, GuardKind
        from ..sources import IdentitySource

        mutated = {id(c): c for c in self.mutated_containers()}
        mutated.update((id(e.obj), e.obj) for e in self.attr_mutations.values())
        tracked = [(type(value), vt) for value, vt in self.output.object_trackers.values()]
        type_of = {id(vt): t for t, vt in tracked}
        for m in mutated.values():
            if m.source is None or not m.source.guardable or id(m) not in type_of:
                continue
            for typ, other in tracked:
                if other is m or other.source is None or not other.source.guardable or \
                        typ is not type_of[id(m)]:
                    continue
                self.output.guards.add(Guard(IdentitySource(other.source, m.source),
                                             GuardKind.CONSTANT_MATCH, False,
                                             what="distinct objects"))

    def codegen(self, cg: Any) -> None:
        """Append the replay to ``cg`` (stack-neutral)."""
        self.guard_no_aliasing()
        containers = self.mutated_containers()
        if not (containers or self.attr_mutations or self.global_stores or self.cell_stores):
            return
        counter = iter(range(1 << 30))

        from .variables.containers import load_key

        def temp(var: VariableTracker) -> str:
            if id(var) in cg.temps:
                return cg.temps[id(var)]
            name = f"___kiln_side_effect_{next(counter)}"
            cg.store_in_temp(var, name)
            return name

        def value_loader(var: VariableTracker):
            from .variables.constant import ConstantVariable

            if isinstance(var, ConstantVariable) and type(var.value) in (
                    int, float, bool, str, type(None)):
                return lambda: cg(var)
            name = temp(var)
            return lambda: cg.load_fast(name)

        # phase 1: objects and new contents into temporaries
        plans = []
        for c in containers:
            obj = temp(c)
            name = f"___kiln_side_effect_{next(counter)}"
            if isinstance(c.items, dict):
                for k, v in c.items.items():
                    load_key(cg, k)
                    cg(v)
                cg.build_map(len(c.items))
            else:
                for v in c.items:
                    cg(v)
                cg.build_list(len(c.items))
            cg.store_fast(name)
            plans.append(("container", c, obj, name))
        for entry in self.attr_mutations.values():
            obj = temp(entry.obj)
            stores = [(n, None if v is DELETED else value_loader(v))
                      for n, v in entry.stores.items()]
            plans.append(("attrs", entry, obj, stores))
        globals_plan = [(n, value_loader(v)) for n, v in self.global_stores.items()]
        cells_plan = [(cell, value_loader(v)) for cell, v in self.cell_stores.values()]

        # phase 2: apply
        for kind, what, obj, payload in plans:
            if kind == "container":
                if isinstance(what.items, dict):
                    for method, arg in (("clear", None), ("update", payload)):
                        cg.load_fast(obj)
                        cg.load_attr(method)
                        if arg is not None:
                            cg.load_fast(arg)
                        cg.call_simple(0 if arg is None else 1)
                        cg.pop_top()
                else:  # obj[:] = new_items
                    cg.load_fast(payload)
                    cg.load_fast(obj)
                    cg.load_const(None)
                    cg.load_const(None)
                    cg.build_slice(2)
                    cg.append(create_instruction("STORE_SUBSCR"))
            else:
                for name, load in payload:
                    if load is None:
                        cg.load_fast(obj)
                        cg.append(create_instruction("DELETE_ATTR", argval=name))
                    else:
                        load()
                        cg.load_fast(obj)
                        cg.extend(builders.store_attr(name))
        for name, load in globals_plan:
            load()
            cg.append(create_instruction("STORE_GLOBAL", argval=name))
        for cell, load in cells_plan:
            load()
            cg.load_const_object(cell)
            cg.extend(builders.store_attr("cell_contents"))


def delete_subscr(tx: Any, obj: VariableTracker, index: VariableTracker) -> None:
    """``del obj[index]`` on a list or dict (one from the frame is replayed later)."""
    from .variables.base import NotConstant
    from .variables.containers import ConstDictVariable, ListVariable

    if not isinstance(obj, (ListVariable, ConstDictVariable)):
        raise Unsupported(f"del on {obj.describe()}")
    try:
        key = index.as_python_constant()
    except NotConstant:
        raise Unsupported(f"del with index {index.describe()}") from None
    obj.check_mutable("del")
    try:
        del obj.items[key]
    except (KeyError, IndexError, TypeError) as e:
        raise Unsupported(f"del raised {type(e).__name__}: {e}") from None


def _contents_key(items: Any) -> Any:
    if isinstance(items, dict):
        return [(k, id(v)) for k, v in items.items()]
    return [id(v) for v in items]


__all__ = ["DELETED", "SideEffects", "delete_subscr"]
