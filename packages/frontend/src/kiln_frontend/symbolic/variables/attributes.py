"""Python's attribute lookup, written once for every tracker of an object that has a class
and an instance namespace (``nn.Module`` instances, user objects from the frame's inputs,
objects made while tracing).

CPython's ``object.__getattribute__(obj, name)``, in its order:

1. a *data descriptor* found on the type's MRO (``property``, a ``__slots__`` member, any
   class whose type defines ``__set__`` or ``__delete__``) wins;
2. then the instance ``__dict__``;
3. then a *non-data descriptor* on the type (a function -> bound method, ``staticmethod``,
   ``classmethod``, ``functools.cached_property``, ...) or a plain class attribute;
4. if all that fails, the type's ``__getattr__`` (``nn.Module.__getattr__`` reads
   ``_parameters``/``_buffers``/``_modules``).

A type with its own ``__getattribute__`` replaces steps 1-3.  Getting this order wrong is a
silent wrong result (a submodule named like a class method, a property shadowed by an
instance entry), so no tracker keeps its own copy of it.

A tracker takes part by implementing the ``AttributeOwner`` hooks: where its instance
namespace is, how a function found on the class is bound, how an attribute is read for real
(for objects reachable through a source: the guard re-reads it the same way), and what its
``__getattr__`` stage is.  Kinds of class attributes are a registry keyed by type.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from .base import BoundMethodVariable, VariableTracker, constant_or_break
from .raising import TracedException, raise_traced

#: "not found" (None is a legitimate attribute value)
MISSING: Any = object()

#: marks an attribute deleted by the frame (side_effects.py records it; read here too)
DELETED: Any = object()


def is_slot_of(cls: type, name: str, attr: Any) -> bool:
    """``attr``, what ``cls``'s MRO has under ``name``, is a ``__slots__`` member of one of
    its classes (read and written in the object's ``slots``, not its ``__dict__``)."""
    return type(attr) is types.MemberDescriptorType and attr.__objclass__ in cls.__mro__ and \
        attr.__name__ == name


class MissingAttribute(Exception):
    """Steps 1-3 found nothing (``__getattr__``, if any, comes next)."""


def class_attribute(cls: type, name: str) -> tuple[Any, type | None]:
    """``name`` in the first class of ``cls.__mro__`` whose ``__dict__`` has it (what
    CPython's ``_PyType_Lookup`` does: no descriptor is invoked), and that class."""
    for klass in cls.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name], klass
    return MISSING, None


def is_data_descriptor(attr: Any) -> bool:
    t = type(attr)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


def is_descriptor(attr: Any) -> bool:
    return hasattr(type(attr), "__get__")


class AttributeOwner:
    """Hooks a tracker implements to use ``load_attribute``."""

    def lookup_class(self) -> type:
        raise NotImplementedError

    def lookup_instance(self, tx, name: str) -> VariableTracker | Any:
        """The instance-namespace entry ``name`` as a tracker, or MISSING."""
        raise NotImplementedError

    def lookup_method(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        """A Python function found on the class, bound to this object."""
        raise NotImplementedError

    def lookup_class_member(self, tx, name: str, value: Any, klass: type) -> VariableTracker:
        """A class attribute that is not a descriptor handled here (a plain value, the
        function of a ``staticmethod``...)."""
        raise NotImplementedError

    def lookup_classmethod(self, tx, name: str, fn: types.FunctionType) -> VariableTracker:
        raise NotImplementedError

    def lookup_real(self, tx, name: str, why: str) -> VariableTracker:
        """``getattr(obj, name)`` evaluated on the real object and guarded by re-reading
        it (objects with a source); Unsupported for objects made while tracing."""
        raise Unsupported(f"attribute {name!r} of {self.describe()} ({why})")

    def lookup_cache(self, tx, name: str, value: VariableTracker) -> None:
        """Store ``value`` in the instance namespace (``cached_property``)."""
        raise Unsupported(f"caching {name!r} on {self.describe()}")

    def lookup_namespace(self, tx) -> VariableTracker:
        """``obj.__dict__``: the real dict, as a dict tracker (attribute reads then go
        through it, see ``namespace_view``); not once the frame assigned attributes of
        the object (those are replayed later: the dict would not show them)."""
        if tx.output.side_effects.attr_mutations.get(id(self)):
            raise Unsupported(f"__dict__ of {self.describe()} after the frame assigned "
                              "its attributes")
        return self.lookup_real(tx, "__dict__", "its namespace")

    def slot_method(self, tx, attr: Any) -> VariableTracker | None:
        """What ``super().<name>`` reaching ``attr`` (a slot of the attribute protocol) is
        on this object, or None when ``attr`` is no such slot."""
        if attr is object.__getattribute__:
            return object_getattribute(self)
        return None

    def lookup_getattribute(self, tx, name: str, getattribute: Any) -> VariableTracker:
        """The type's own ``__getattribute__`` (not object's) for ``name``."""
        return self.lookup_real(tx, name, "its class defines __getattribute__")

    def lookup_getattr_fallback(self, tx, name: str, fallback: Any) -> VariableTracker:
        """The type's ``__getattr__`` (``fallback``, found on its MRO) for ``name``."""
        return self.lookup_missing(tx, name)

    def lookup_missing(self, tx, name: str) -> VariableTracker:
        """No attribute ``name`` at all: AttributeError raised in the traced code, where a
        traced ``except AttributeError`` (``getattr`` with a default) catches it as in eager;
        for an object with a source, guarded on the attribute staying absent."""
        source = getattr(self, "source", None)
        if source is not None:
            from ...guards import Guard, GuardKind

            tx.output.guards.add(Guard(source, GuardKind.HASATTR, (name, False)))
        raise_traced(AttributeError, f"{self.lookup_class().__qualname__!r} object has no "
                                     f"attribute {name!r}")


# -- descriptors found on the class -------------------------------------------------------


def _property(tx, obj, cls, name, attr, klass):
    if not isinstance(attr.fget, types.FunctionType):
        return obj.lookup_real(tx, name, "a property whose getter is not Python")
    return upper.call_property(tx, cls, name, attr, obj)


def _function(tx, obj, cls, name, attr, klass):
    return obj.lookup_method(tx, name, attr)


def _staticmethod(tx, obj, cls, name, attr, klass):
    return obj.lookup_class_member(tx, name, attr.__func__, klass)


def _classmethod(tx, obj, cls, name, attr, klass):
    if not isinstance(attr.__func__, types.FunctionType):
        return obj.lookup_real(tx, name, "a classmethod of a C function")
    return obj.lookup_classmethod(tx, name, attr.__func__)


def _cached_property(tx, obj, cls, name, attr, klass):
    """Not cached yet (a cached value sits in the instance dict and is found first): the
    getter runs and its value is cached, as ``cached_property.__get__`` does."""
    if getattr(obj, "source", None) is not None:
        # run it now, on the real object: it runs once in eager too, and from then on the
        # value is an instance entry (read, and guarded, through the source)
        return obj.lookup_real(tx, name, "cached_property")
    upper.guard_class_member(tx, cls, name, attr)
    value = upper.UserFunctionVariable(attr.func).call_function(tx, [obj], {})
    obj.lookup_cache(tx, name, value)
    return value


def _member_slot(tx, obj, cls, name, attr, klass):
    """A ``__slots__`` member: an object made by the frame keeps its slots' trackers; any
    other is read for real (guarded through its source)."""
    read_slot = getattr(obj, "read_slot", None)
    if read_slot is not None and getattr(obj, "source", None) is None and \
            is_slot_of(cls, name, attr):
        return read_slot(tx, name, attr)
    return obj.lookup_real(tx, name, "a __slots__ member")


#: how a class attribute of each type is read through an instance (step 1 for data
#: descriptors, step 3 for the others); other descriptors are read for real
DESCRIPTORS: dict[type, Callable[..., VariableTracker]] = {
    property: _property,
    types.FunctionType: _function,
    staticmethod: _staticmethod,
    classmethod: _classmethod,
    functools.cached_property: _cached_property,
    types.MemberDescriptorType: _member_slot,
}


def _dunder_class(tx, obj, cls, name, attr, klass):
    return upper.wrap_class(cls)  # the class is fixed by the object's guards


#: descriptors handled by identity, before their type's entry in DESCRIPTORS
NAMED_DESCRIPTORS: dict[Any, Callable[..., VariableTracker]] = {
    object.__dict__["__class__"]: _dunder_class,
}


def _descriptor(tx, obj, cls: type, name: str, attr: Any, klass: type) -> VariableTracker:
    named = NAMED_DESCRIPTORS.get(attr)
    if named is not None:
        return named(tx, obj, cls, name, attr, klass)
    for t in type(attr).__mro__:
        handler = DESCRIPTORS.get(t)
        if handler is not None:
            return handler(tx, obj, cls, name, attr, klass)
    if getattr(obj, "source", None) is None and python_slot(attr, "__get__") is not None:
        # an object made by the frame has no real self to read through: the user
        # descriptor's own __get__ is inlined (with a source, the real read is guarded)
        return call_descriptor_slot(tx, attr, klass, name, "__get__", [obj, _class_of(cls)])
    return obj.lookup_real(tx, name, f"a {type(attr).__qualname__} descriptor")


def _class_of(cls: type) -> VariableTracker:
    return upper.wrap_class(cls)


def python_slot(attr: Any, slot: str) -> types.FunctionType | None:
    """``type(attr).<slot>`` when it is a Python function (a user-written descriptor)."""
    fn, _ = class_attribute(type(attr), slot)
    return fn if isinstance(fn, types.FunctionType) else None


def call_descriptor_slot(tx, attr: Any, klass: type, name: str, slot: str,
                         args: list) -> VariableTracker:
    """``type(attr).<slot>(attr, *args)`` inlined for the user descriptor ``attr`` found as
    ``klass.__dict__[name]``: guarded on that entry's identity, and the descriptor's own
    state read (and guarded) through it, pinned."""
    from ...guards import Guard, GuardKind
    from ...sources import AttrSource, GetItemSource

    entry = GetItemSource(AttrSource(tx.output.pinned_source(klass), "__dict__"), name)
    tx.output.guards.add(Guard(entry, GuardKind.ID_MATCH, id(attr), "class member"))
    desc = tx.wrap_value(attr, tx.output.pinned_source(attr))
    return desc.var_getattr(tx, slot).call_function(tx, list(args), {})


# -- the protocol -------------------------------------------------------------------------


def generic_getattr(tx, obj: AttributeOwner, name: str) -> VariableTracker:
    """``object.__getattribute__(obj, name)``: raises MissingAttribute when steps 1-3 find
    nothing."""
    cls = obj.lookup_class()
    attr, klass = class_attribute(cls, name)
    if name == "__dict__" and type(attr) is types.GetSetDescriptorType:
        return obj.lookup_namespace(tx)
    if attr is not MISSING and is_data_descriptor(attr):
        return _descriptor(tx, obj, cls, name, attr, klass)
    found = obj.lookup_instance(tx, name)
    if found is not MISSING:
        return found
    if attr is MISSING:
        raise MissingAttribute(name)
    stored = tx.output.side_effects.class_store(cls, name)
    if stored is not None:  # the frame replaced this plain class value (``Cls.n += 1``)
        return stored
    if is_descriptor(attr):
        return _descriptor(tx, obj, cls, name, attr, klass)
    return obj.lookup_class_member(tx, name, attr, klass)


#: ``__getattribute__`` slots that are CPython's generic lookup (BaseException's wraps
#: ``PyObject_GenericGetAttr`` too): ``generic_getattr`` is what they do
GENERIC_GETATTRIBUTE = (object.__getattribute__, BaseException.__getattribute__)


def load_attribute(tx, obj: AttributeOwner, name: str) -> VariableTracker:
    """``obj.name``: the type's ``__getattribute__`` (object's: ``generic_getattr``), then
    its ``__getattr__`` when that finds nothing."""
    cls = obj.lookup_class()
    getattribute, _ = class_attribute(cls, "__getattribute__")
    if getattribute not in GENERIC_GETATTRIBUTE:
        if tx.output.side_effects.has_class_stores():  # it may read the class for real
            raise Unsupported(f"attribute {name!r} through a __getattribute__ after a store "
                              "to a class attribute")
        return obj.lookup_getattribute(tx, name, getattribute)
    try:
        return generic_getattr(tx, obj, name)
    except MissingAttribute:
        pass
    fallback, _ = class_attribute(cls, "__getattr__")
    if fallback is MISSING:
        return obj.lookup_missing(tx, name)
    return obj.lookup_getattr_fallback(tx, name, fallback)


#: class attributes whose read through an instance cannot raise AttributeError
_NEVER_RAISE = (types.FunctionType, staticmethod, classmethod, functools.cached_property)


def static_hasattr(cls: type, in_instance: bool, name: str) -> bool | None:
    """``hasattr(obj, name)`` for an object of ``cls`` whose instance namespace has (or
    has not) ``name``, decided without running code; None when only running a getter, a
    descriptor or ``__getattr__``/``__getattribute__`` would tell (they may raise
    AttributeError)."""
    if class_attribute(cls, "__getattribute__")[0] is not object.__getattribute__:
        return None
    attr, _ = class_attribute(cls, name)
    if attr is not MISSING and is_data_descriptor(attr):
        return None
    if in_instance:
        return True
    if attr is not MISSING:
        return None if is_descriptor(attr) and not isinstance(attr, _NEVER_RAISE) else True
    return None if class_attribute(cls, "__getattr__")[0] is not MISSING else False


def is_attribute_error(error: Unsupported) -> bool:
    """Whether a lookup that failed while tracing raised AttributeError in the traced code
    (any other failure, a graph break naming one included, stays a graph break: guessing
    from its text could turn a kiln limitation into a wrong False)."""

    return isinstance(error, TracedException) and issubclass(error.exc.cls, AttributeError)


def traced_hasattr(tx, obj: AttributeOwner, in_instance: bool, name: str) -> bool:
    """``hasattr(obj, name)``: ``getattr`` catching AttributeError, as Python does; the
    lookup is traced only when it may run code (its effects are eager's too)."""
    known = static_hasattr(obj.lookup_class(), in_instance, name)
    if known is not None:
        return known
    try:
        load_attribute(tx, obj, name)
    except Unsupported as e:
        if is_attribute_error(e):
            return False
        raise
    return True


def data_descriptor_setter(cls: type, name: str) -> Any:
    """The data descriptor an ``obj.name = value`` goes through (CPython's
    ``object.__setattr__`` calls it before the instance dict), or MISSING."""
    attr, _ = class_attribute(cls, name)
    if attr is not MISSING and is_data_descriptor(attr):
        return attr
    return MISSING


def store_through_descriptor(tx, obj: VariableTracker, cls: type, name: str,
                             value: VariableTracker) -> bool:
    """``obj.name = value`` where the type has a data descriptor for ``name``: a property's
    Python setter is inlined (its own stores are then recorded as usual); True when done.
    A user descriptor's Python ``__set__`` is inlined for an object made by the frame.
    Other data descriptors (slots, C setters) are left to the caller."""
    attr = data_descriptor_setter(cls, name)
    if attr is not MISSING and not isinstance(attr, property) and \
            getattr(obj, "source", None) is None and python_slot(attr, "__set__") is not None:
        # a user descriptor on an object made by the frame (its reads inline __get__ too)
        _, klass = class_attribute(cls, name)
        call_descriptor_slot(tx, attr, klass, name, "__set__", [obj, value])
        return True
    if not isinstance(attr, property):
        return False
    if attr.fset is None:
        raise Unsupported(f"AttributeError: property {name!r} of {cls.__qualname__} has no "
                          "setter")
    if not isinstance(attr.fset, types.FunctionType):
        raise Unsupported(f"property {name!r} of {cls.__qualname__} with a C setter")
    upper.guard_class_member(tx, cls, name, attr)
    upper.UserFunctionVariable(attr.fset).call_function(tx, [obj, value], {})
    return True


class AttributeSlotVariable(BoundMethodVariable):
    """A slot of the attribute protocol bound to an object tracker, as ``super()`` reaches
    it from a class's own ``__getattribute__``/``__getattr__`` (``object.__getattribute__``,
    ``nn.Module.__getattr__``): called with a constant name, it runs that stage alone."""

    owner = property(lambda self: self.obj, doc="the object tracker the slot is bound to")
    what = property(lambda self: self.name,
                    doc="the slot, as printed (``object.__getattribute__``)")

    def __init__(self, owner: VariableTracker, what: str,
                 lookup: Callable[[Any, str], VariableTracker]):
        super().__init__(owner, what)
        self.lookup = lookup

    def describe(self) -> str:
        return f"{self.what} of {self.owner.describe()}"

    def call_function(self, tx, args, kwargs):
        if kwargs or len(args) != 1:
            raise Unsupported(f"{self.what} with {len(args)} arguments")
        return self.lookup(tx, attribute_name(args[0], self.what))


def attribute_name(arg: VariableTracker, what: str) -> str:
    """The name a slot of the attribute protocol (``what``) was called with: a constant str,
    or a graph break."""
    name = constant_or_break(arg, f"{what} with a non-constant name")
    if not isinstance(name, str):
        raise Unsupported(f"{what} with a {type(name).__name__} name")
    return name


def object_getattribute(owner: AttributeOwner) -> AttributeSlotVariable:
    """``object.__getattribute__`` bound to ``owner``: steps 1-3, no ``__getattr__``."""

    def lookup(tx, name):
        try:
            return generic_getattr(tx, owner, name)
        except MissingAttribute:
            return owner.lookup_missing(tx, name)

    return AttributeSlotVariable(owner, "object.__getattribute__", lookup)


def hasattr_after_frame_store(tx, obj: VariableTracker, name: str) -> bool | None:
    """``hasattr(obj, name)`` once the frame itself assigned or deleted ``obj.name`` (the
    real object shows neither yet: stores are replayed after the graph); None when it did
    not.  After ``del obj.name`` only a class attribute is left (nn.Module's
    ``__delattr__`` removes the name from its tables too)."""
    from torch import nn

    entry = tx.output.side_effects.attr_mutations.get(id(obj))
    if entry is None or name not in entry.stores:
        return None
    if entry.stores[name] is not DELETED:
        return True
    real = getattr(obj, "module", None)
    cls = type(real if real is not None else getattr(obj, "value", None))
    attr, _ = class_attribute(cls, name)
    getattribute, _ = class_attribute(cls, "__getattribute__")
    fallback, _ = class_attribute(cls, "__getattr__")
    if getattribute is object.__getattribute__:
        if attr is not MISSING and (not is_descriptor(attr) or isinstance(attr, _NEVER_RAISE)):
            return True
        if attr is MISSING and fallback in (MISSING, nn.Module.__getattr__):
            return False
    raise Unsupported(f"hasattr({cls.__qualname__}, {name!r}) after the frame deleted it "
                      "would run code")


def namespace_view(tx, obj: VariableTracker) -> VariableTracker | None:
    """The dict tracker of ``obj.__dict__`` when the frame read it (and may have changed it
    since: ``obj.__dict__[k] = v``): the object's instance namespace from then on, so
    attribute reads go through it and attribute stores are a graph break (two trackers of
    one namespace would disagree)."""
    from .containers import ConstDictVariable

    real = getattr(obj, "module", None)
    if real is None:
        real = getattr(obj, "value", None)
    try:
        namespace = object.__getattribute__(real, "__dict__")
    except AttributeError:
        return None
    # by identity: ``obj.__dict__``, ``vars(obj)`` or a frame argument holding that dict
    view = tx.output.tracker_for_object(namespace)
    return view if isinstance(view, ConstDictVariable) else None
