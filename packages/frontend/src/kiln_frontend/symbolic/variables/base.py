"""VariableTracker: the symbolic stand-in for one Python value, and the ``@tracker_for``
registry that says which tracker wraps a real object of a given type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from ...sources import Source

#: what trackers are handed as ``tx`` (``translator.InstructionTranslatorBase``) and as
#: ``codegen`` (``codegen.PyCodegen``): both live layers above the trackers (layers.py), so
#: trackers call their methods and never import them
Translator = Any
Codegen = Any


class NotConstant(Exception):
    """``as_python_constant`` on a tracker whose value is not known at trace time."""


class VariableTracker:
    """Base class of every tracker.

    * ``source``: where the value lives in the frame (None for values made while tracing).
    * ``mutable``: a container created during tracing whose contents may change (lists,
      dicts); reconstructing it builds a new object, so the code generator keeps aliases.
    """

    mutable: bool = False

    def __init__(self, *, source: Source | None = None):
        self.source = source

    # -- what it is -------------------------------------------------------------------

    def python_type(self) -> type:
        try:
            return type(self.as_python_constant())
        except NotConstant:
            raise Unsupported(f"type of {self} is not known") from None

    def as_python_constant(self) -> Any:
        raise NotConstant(repr(self))

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except NotConstant:
            return False

    # -- graph interface --------------------------------------------------------------

    def as_proxy(self) -> Any:
        """The value as an FX graph argument (Proxy/Node, constant, or nested)."""
        try:
            return self.as_python_constant()
        except NotConstant:
            raise Unsupported(f"cannot pass {self} into a graph") from None

    def as_example(self) -> Any:
        """The value as an argument for running an op on fake tensors."""
        return self.as_proxy()

    # -- behaviour --------------------------------------------------------------------

    def var_getattr(self, tx: Translator, name: str) -> VariableTracker:
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def call_function(self, tx: Translator, args: list[VariableTracker],
                      kwargs: dict[str, VariableTracker]) -> VariableTracker:
        raise Unsupported(f"call to {self.describe()}")

    def call_method(self, tx: Translator, name: str,
                    args: list[VariableTracker],
                    kwargs: dict[str, VariableTracker]) -> VariableTracker:
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def has_unpack_var_sequence(self, tx: Translator) -> bool:
        return False

    def unpack_var_sequence(self, tx: Translator) -> list[VariableTracker]:
        raise Unsupported(f"iterating over {self.describe()}")

    def iter_var(self, tx: Translator) -> VariableTracker:
        """``iter(value)``: an iterator tracker with ``next_item(tx)``.  Default: over the
        items as they are now; containers override it with live iterators (a list grown
        while iterated is seen, a dict resized raises as in eager)."""
        return upper.ListIteratorVariable(tx.unpack_sequence(self))

    def truth_value(self, tx: Translator) -> bool:
        """``bool(value)`` at trace time, or raise Unsupported."""
        try:
            return bool(self.as_python_constant())
        except NotConstant:
            raise Unsupported(f"truth value of {self.describe()}") from None

    def children(self) -> list[VariableTracker]:
        """Trackers this one holds (container items, a bound method's object...)."""
        return []

    # -- code generation --------------------------------------------------------------

    def reconstruct(self, codegen: Codegen) -> None:
        """Emit bytecode that pushes this value.  Default: reload it from its source."""
        if self.source is not None:
            self.source.reconstruct(codegen)
            return
        raise Unsupported(f"cannot rebuild {self.describe()} in generated code")

    def reload_or_load(self, codegen: Codegen, value: Any) -> None:
        """Push this value: reloaded from its source when it has one (so a guard on the
        source keeps holding), else ``value`` itself as a constant of the generated code."""
        if self.source is not None:
            self.source.reconstruct(codegen)
            return
        codegen.load_const_object(value)

    # -- printing ---------------------------------------------------------------------

    def describe(self) -> str:
        if self.source is not None:
            return f"{type(self).__name__}({self.source.name()})"
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()


class BoundMethodVariable(VariableTracker):
    """``obj.name`` loaded from a tracker and not called yet: the one shape of every such
    bound-method tracker (list, dict, set, deque, namedtuple, constant, model output, ndarray,
    generator, module); subclasses give ``call_function``, and ``owner_label`` (``"ndarray"``)
    when they print as ``ndarray.name``."""

    #: what ``describe`` prints before ``.name``; None keeps the tracker's plain description
    owner_label: str | None = None

    def __init__(self, obj: VariableTracker, name: str):
        super().__init__()
        self.obj = obj
        self.name = name

    def children(self):
        return [self.obj]

    def describe(self) -> str:
        if self.owner_label is None:
            return super().describe()
        return f"{self.owner_label}.{self.name}"


class KnownCallableVariable(VariableTracker):
    """One known Python callable (a builtin, a torch function, a function with a handler):
    it is its own constant, and generated code reloads it from its source, or loads the
    object itself when it has none."""

    def __init__(self, fn: Any, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def describe(self) -> str:
        return f"{type(self).__name__}({self.name})"

    def reconstruct(self, codegen: Codegen) -> None:
        self.reload_or_load(codegen, self.fn)


# --------------------------------------------------------------------------------------
# @tracker_for registry
# --------------------------------------------------------------------------------------

#: python type -> tracker class (whose ``wrap(builder, value)`` classmethod builds it)
_TRACKERS: dict[type, type[VariableTracker]] = {}


def constant_or_break(v: VariableTracker, why: str) -> Any:
    """``v``'s Python value, where a rule needs a constant: a graph break saying ``why``
    when it is known only at run time."""
    try:
        return v.as_python_constant()
    except NotConstant:
        raise Unsupported(why) from None


def tracker_for(*types: type) -> Callable[[type[VariableTracker]], type[VariableTracker]]:
    """Class decorator: this tracker wraps real objects of ``types`` (and their subclasses,
    unless a more specific registration exists).  The class must define
    ``wrap(cls, builder, value) -> VariableTracker``."""

    def deco(cls: type[VariableTracker]) -> type[VariableTracker]:
        if not hasattr(cls, "wrap"):
            raise TypeError(f"{cls.__name__} has no wrap(builder, value) classmethod")
        for t in types:
            if t in _TRACKERS and _TRACKERS[t] is not cls:
                raise ValueError(f"{t!r} already tracked by {_TRACKERS[t].__name__}")
            _TRACKERS[t] = cls
        return cls

    return deco


def lookup_tracker(value: Any) -> type[VariableTracker] | None:
    for cls in type(value).__mro__:
        tracker = _TRACKERS.get(cls)
        if tracker is not None:
            return tracker
    return None


def registered_types() -> dict[type, type[VariableTracker]]:
    return dict(_TRACKERS)
