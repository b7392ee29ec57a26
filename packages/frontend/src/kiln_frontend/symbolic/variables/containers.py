"""Tuples, lists, dicts and iterators over them."""

from __future__ import annotations

import collections
from typing import Any

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from ...sources import DictKeySource, GetItemSource
from .base import BoundMethodVariable, NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable
from .raising import raise_traced, raise_traced_from


def snapshot_items(items: Any) -> Any:
    """What ``check_mutable`` keeps of a container from the frame before its first
    mutation (side_effects.py compares the items with it)."""
    return dict(items) if isinstance(items, dict) else list(items)


def _const_index(tx, index: VariableTracker) -> Any:
    try:
        return index.as_python_constant()
    except NotConstant:
        raise Unsupported(f"indexing a container with {index.describe()}") from None


class BaseSequenceVariable(VariableTracker):
    """Common part of tuples and lists: a Python list of item trackers."""

    python_cls: type = tuple

    def __init__(self, items: list[VariableTracker], *, source=None):
        super().__init__(source=source)
        self.items = list(items)

    def python_type(self) -> type:
        return self.python_cls

    def as_python_constant(self) -> Any:
        return self.python_cls(i.as_python_constant() for i in self.items)

    def as_proxy(self) -> Any:
        return self.python_cls(i.as_proxy() for i in self.items)

    def as_example(self) -> Any:
        return self.python_cls(i.as_example() for i in self.items)

    def truth_value(self, tx) -> bool:
        return bool(self.items)

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        return list(self.items)

    def iter_var(self, tx) -> VariableTracker:
        # CPython's list iterator reads the list at each step: items appended while
        # iterating are seen
        return ListIteratorVariable(self.items, seq=self)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        idx = _const_index(tx, index)
        if isinstance(idx, slice):
            return type(self)(self.items[idx]) if not isinstance(self, TupleVariable) else \
                TupleVariable(self.items[idx])
        try:
            return self.items[idx]
        except (IndexError, TypeError) as e:
            raise_traced_from(e, f"indexing a {self.python_cls.__name__}")

    def children(self):
        return list(self.items)

    def reconstruct_items(self, codegen) -> None:
        for item in self.items:
            codegen(item)

    def describe(self) -> str:
        inner = ", ".join(i.describe() for i in self.items[:4])
        if len(self.items) > 4:
            inner += ", ..."
        src = f" from {self.source.name()}" if self.source is not None else ""
        return f"{type(self).__name__}([{inner}]{src})"

    @classmethod
    def wrap_items(cls, builder, value) -> list[VariableTracker]:
        builder.install_guard(GuardKind.LIST_LENGTH, (type(value), len(value)))
        src = builder.source
        return [builder.child(GetItemSource(src, i) if src is not None else None)(v)
                for i, v in enumerate(value)]


@upper.provide
@tracker_for(tuple)
class TupleVariable(BaseSequenceVariable):
    python_cls = tuple

    def __init__(self, items, *, source=None, tuple_cls: type = tuple):
        super().__init__(items, source=source)
        self.tuple_cls = tuple_cls

    @classmethod
    def wrap(cls, builder, value):
        if type(value) is tuple or _is_namedtuple(type(value)) or _is_structseq(type(value)):
            return cls(cls.wrap_items(builder, value), source=builder.source,
                       tuple_cls=type(value))
        raise Unsupported(f"tuple subclass {type(value).__qualname__}")

    def python_type(self) -> type:
        return self.tuple_cls

    def var_getattr(self, tx, name):
        fields = getattr(self.tuple_cls, "_fields", None) or getattr(
            self.tuple_cls, "__match_args__", None)
        if fields and name in fields:
            return self.items[fields.index(name)]
        if name in ("index", "count"):
            return SequenceMethodVariable(self, name)
        if _is_namedtuple(self.tuple_cls):
            if name == "_fields":
                return ConstantVariable.create(tuple(self.tuple_cls._fields))
            if name in ("_replace", "_asdict"):
                return NamedTupleMethodVariable(self, name)
            import inspect
            import types

            try:
                static = inspect.getattr_static(self.tuple_cls, name)
            except AttributeError:
                raise Unsupported(f"{self.tuple_cls.__qualname__} has no attribute "
                                  f"{name!r}") from None
            if isinstance(static, types.FunctionType):
                return upper.method_of_pinned_class(tx, self.tuple_cls, name, static, self)
            if isinstance(static, property) and isinstance(static.fget, types.FunctionType):
                return upper.call_property(tx, self.tuple_cls, name, static, self)
        raise Unsupported(f"attribute {name!r} of a tuple")

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        if self.tuple_cls is not tuple:
            # namedtuple: cls._make(items); structseq (torch.return_types.*): cls(items)
            codegen.load_const_object(self.tuple_cls)
            if hasattr(self.tuple_cls, "_make"):
                codegen.load_attr("_make")
            self.reconstruct_items(codegen)
            codegen.build_tuple(len(self.items))
            codegen.call_simple(1)
            return
        self.reconstruct_items(codegen)
        codegen.build_tuple(len(self.items))


def _is_structseq(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "n_fields")


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")


@upper.provide
@tracker_for(list)
class ListVariable(BaseSequenceVariable):
    python_cls = list
    mutable = True

    @classmethod
    def wrap(cls, builder, value):
        if type(value) is not list:
            raise Unsupported(f"list subclass {type(value).__qualname__}")
        return cls(cls.wrap_items(builder, value), source=builder.source)

    def check_mutable(self, what: str) -> None:
        # a container from the frame: the mutation is replayed after the graph
        # (symbolic/side_effects.py compares the items with this snapshot)
        if self.source is not None and getattr(self, "original_items", None) is None:
            self.original_items = snapshot_items(self.items)

    def var_getattr(self, tx, name):
        if name in ("append", "extend", "pop", "insert", "clear", "reverse", "index", "count",
                    "copy", "remove", "sort"):
            return SequenceMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a list")

    def setitem(self, tx, index: VariableTracker, value: VariableTracker) -> None:
        self.check_mutable("item assignment")
        idx = _const_index(tx, index)
        if isinstance(idx, slice):
            if not value.has_unpack_var_sequence(tx):
                raise Unsupported("slice assignment from a non-sequence")
            self.items[idx] = value.unpack_var_sequence(tx)
        else:
            self.items[idx] = value

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        self.reconstruct_items(codegen)
        codegen.build_list(len(self.items))


class SequenceMethodVariable(BoundMethodVariable):
    """``lst.append`` and friends, bound to a tuple/list tracker."""

    def describe(self) -> str:
        return f"{self.obj.python_cls.__name__}.{self.name}"

    def call_function(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        none = ConstantVariable(None)
        if name == "sort" and not args:
            # the order sorted() gives (same key calls, stable, reverse keeps ties' order)
            ordered = upper.traced_sorted(tx, [ListVariable(list(obj.items))], kwargs)
            if ordered is None:
                raise Unsupported(f"{self.describe()} with these arguments")
            obj.check_mutable("list.sort")
            obj.items[:] = tx.unpack_sequence(ordered)
            return none
        if kwargs:
            raise Unsupported(f"{self.describe()} with keyword arguments")
        if name == "remove" and len(args) == 1:
            obj.check_mutable("list.remove")
            obj.items.pop(_first_equal(tx, obj.items, args[0], "list.remove"))
            return none
        if name == "append" and len(args) == 1:
            obj.check_mutable("list.append")
            obj.items.append(args[0])
            return none
        if name == "extend" and len(args) == 1:
            obj.check_mutable("list.extend")
            if isinstance(args[0], BaseSequenceVariable):  # CPython copies a list/tuple first
                obj.items.extend(args[0].unpack_var_sequence(tx))
            else:  # any other iterable: each item appended as it is produced
                for item in iterate(tx, args[0]):
                    obj.items.append(item)
            return none
        if name == "insert" and len(args) == 2:
            obj.check_mutable("list.insert")
            obj.items.insert(_const_index(tx, args[0]), args[1])
            return none
        if name == "pop" and len(args) <= 1:
            obj.check_mutable("list.pop")
            idx = _const_index(tx, args[0]) if args else -1
            try:
                return obj.items.pop(idx)
            except (IndexError, TypeError) as e:
                raise_traced_from(e, "list.pop")
        if name == "clear" and not args:
            obj.check_mutable("list.clear")
            obj.items.clear()
            return none
        if name == "reverse" and not args:
            obj.check_mutable("list.reverse")
            obj.items.reverse()
            return none
        if name == "copy" and not args:
            return ListVariable(list(obj.items))
        if name in ("index", "count") and len(args) == 1:
            try:
                target = args[0].as_python_constant()
                values = [i.as_python_constant() for i in obj.items]
            except NotConstant:
                raise Unsupported(f"{self.describe()} on non-constant items") from None
            try:
                return ConstantVariable(getattr(values, name)(target))
            except ValueError as e:  # list.index of a missing item
                raise_traced_from(e, f"{self.describe()}")
        raise Unsupported(f"{self.describe()} with these arguments")


def _first_equal(tx, items: list[VariableTracker], value: VariableTracker, what: str) -> int:
    """The index of the first item that is ``value`` or equals it (CPython's identity-then-
    ``==`` test), decided on identity and constants; ValueError (traced) when none is."""
    for i, item in enumerate(items):
        item = tx.realize(item)
        if upper.is_op(tx, item, value, negate=False).as_python_constant():
            return i
        if not (item.is_python_constant() and value.is_python_constant()):
            raise Unsupported(f"{what}: comparing {item.describe()} with "
                              f"{value.describe()}")
        if item.as_python_constant() == value.as_python_constant():
            return i
    raise_traced(ValueError, f"{what}(x): x not in list")


@tracker_for(dict, collections.OrderedDict)
class ConstDictVariable(VariableTracker):
    """A dict whose keys are constants (strings, ints...)."""

    mutable = True

    def __init__(self, items: dict[Any, VariableTracker], *, source=None,
                 dict_cls: type = dict):
        super().__init__(source=source)
        self.items = dict(items)
        self.dict_cls = dict_cls

    @classmethod
    def wrap(cls, builder, value):
        from ...sources import importable_name
        from .constant import is_constant_value

        if not all(is_constant_value(k) or (isinstance(k, type) and importable_name(k)) or
                   is_identity_key(k) for k in value):
            # (importable classes as keys: dispatch tables such as {list: validate_list};
            # the guards name them by import)
            raise Unsupported("dict with non-constant keys")
        # (a module key is compared by identity: the keys guard fixes which module it is)
        builder.install_guard(GuardKind.DICT_KEYS, (type(value), tuple(value.keys())))
        src = builder.source
        items = {}
        for i, (k, v) in enumerate(value.items()):
            if is_identity_key(k):
                # (reached from the dict, not pinned as a global: nothing kiln keeps holds it)
                key_src = DictKeySource(src, i) if src is not None else \
                    builder.tx.output.pinned_source(k)
                key_tracker = builder.child(key_src)(k)
                key = ItemById(k, key_tracker)
            else:
                key = k
            items[key] = builder.child(GetItemSource(src, k) if src is not None else None)(v)
        return cls(items, source=builder.source, dict_cls=type(value))

    def python_type(self) -> type:
        return self.dict_cls

    def children(self):
        return list(self.items.values())

    def as_python_constant(self) -> Any:
        if has_identity_keys(self.items):
            raise NotConstant("a dict keyed by modules")
        return self.dict_cls((k, v.as_python_constant()) for k, v in self.items.items())

    def as_proxy(self) -> Any:
        self._constant_keys("a graph argument")
        return {k: v.as_proxy() for k, v in self.items.items()}

    def as_example(self) -> Any:
        self._constant_keys("a graph argument")
        return {k: v.as_example() for k, v in self.items.items()}

    def _constant_keys(self, what: str) -> None:
        if has_identity_keys(self.items):
            raise Unsupported(f"a dict keyed by modules as {what}")

    def truth_value(self, tx) -> bool:
        return bool(self.items)

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx):
        return [key_var(k) for k in self.items]

    def iter_var(self, tx):
        return DictIteratorVariable(self, "keys")

    def check_mutable(self, what: str) -> None:
        # a container from the frame: the mutation is replayed after the graph
        # (symbolic/side_effects.py compares the items with this snapshot)
        if self.source is not None and getattr(self, "original_items", None) is None:
            self.original_items = snapshot_items(self.items)

    def getitem(self, tx, key: VariableTracker) -> VariableTracker:
        k = dict_key(tx, key)
        if k not in self.items:
            _missing_key(k)  # caught by a traced `except KeyError`, else a break
        return self.items[k]

    def setitem(self, tx, key: VariableTracker, value: VariableTracker) -> None:
        self.check_mutable("item assignment")
        self.items[dict_key(tx, key)] = value

    def var_getattr(self, tx, name):
        if self.dict_cls not in (dict, collections.OrderedDict):
            # a dict subclass: its own Python methods win (inlined with self = this dict)
            import inspect
            import types

            static = inspect.getattr_static(self.dict_cls, name, None)
            if isinstance(static, types.FunctionType):
                return upper.method_of_pinned_class(tx, self.dict_cls, name, static, self)
        return self.builtin_method(tx, name)

    def builtin_method(self, tx, name):
        """``dict.<name>`` bound to this dict (also what ``super().get`` reaches)."""
        if name in ("keys", "values", "items", "get", "update", "pop", "copy", "setdefault",
                    "popitem", "clear"):
            return DictMethodVariable(self, name)
        if name == "move_to_end" and self.dict_cls is collections.OrderedDict:
            return DictMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a dict")

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        if self.dict_cls not in (dict, collections.OrderedDict):
            raise Unsupported(f"cannot rebuild a {self.dict_cls.__qualname__}")
        if self.dict_cls is collections.OrderedDict:  # OrderedDict({k: v, ...})
            codegen.push_null()
            codegen.load_const_object(collections.OrderedDict)
        for k, v in self.items.items():
            load_key(codegen, k)
            codegen(v)
        codegen.build_map(len(self.items))
        if self.dict_cls is collections.OrderedDict:
            codegen.call_function(1)

    def describe(self) -> str:
        return f"ConstDictVariable(keys={list(self.items)!r})"


def _missing_key(k: Any) -> None:
    """KeyError(k), raised as traced code would (a module key breaks the graph: the
    exception's argument would be the module itself)."""
    if isinstance(k, TrackedKey):
        raise Unsupported(f"KeyError for a key that is an object {k!r}")
    raise_traced(KeyError, k)


class DictMethodVariable(BoundMethodVariable):
    def call_function(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(obj, name)
        if name == "get" and 1 <= len(args) <= 2:
            k = dict_key(tx, args[0])
            if k in obj.items:
                return obj.items[k]
            return args[1] if len(args) == 2 else ConstantVariable(None)
        if name == "copy" and not args:
            return ConstDictVariable(dict(obj.items))
        if name == "update" and len(args) <= 1:
            obj.check_mutable("dict.update")
            if args:
                other = args[0]
                if isinstance(other, ConstDictVariable):
                    obj.items.update(other.items)
                else:  # an iterable of (key, value) pairs, each stored as it is produced
                    for pair in iterate(tx, other):
                        k, v = tx.unpack_sequence(pair)
                        obj.items[dict_key(tx, k)] = v
            obj.items.update(kwargs)
            return ConstantVariable(None)
        if name == "pop" and 1 <= len(args) <= 2:
            obj.check_mutable("dict.pop")
            k = dict_key(tx, args[0])
            if k in obj.items:
                return obj.items.pop(k)
            if len(args) == 2:
                return args[1]
            _missing_key(k)
        if name == "popitem" and not args and (
                not kwargs or obj.dict_cls is collections.OrderedDict and set(kwargs) <= {"last"}):
            # the last item (an OrderedDict's first with last=False)
            last = kwargs["last"].as_python_constant() if kwargs else True
            if not obj.items:
                raise_traced(KeyError, "popitem(): dictionary is empty")
            obj.check_mutable("dict.popitem")
            k = next(reversed(obj.items)) if last else next(iter(obj.items))
            return TupleVariable([key_var(k), obj.items.pop(k)])
        if name == "clear" and not args and not kwargs:
            obj.check_mutable("dict.clear")
            obj.items.clear()
            return ConstantVariable(None)
        if name == "setdefault" and 1 <= len(args) <= 2:
            k = dict_key(tx, args[0])
            if k not in obj.items:
                obj.check_mutable("dict.setdefault")
                obj.items[k] = args[1] if len(args) == 2 else ConstantVariable(None)
            return obj.items[k]
        if name == "move_to_end" and len(args) == 1 and set(kwargs) <= {"last"}:
            # an OrderedDict reordered: the replay rebuilds it in the new key order
            k = dict_key(tx, args[0])
            last = kwargs["last"].as_python_constant() if kwargs else True
            if k not in obj.items:
                _missing_key(k)
            obj.check_mutable("OrderedDict.move_to_end")
            v = obj.items.pop(k)
            rest = {} if last else dict(obj.items)
            if not last:
                obj.items.clear()  # (in place: iterators over the dict see the same items)
            obj.items[k] = v
            obj.items.update(rest)
            return ConstantVariable(None)
        raise Unsupported(f"dict.{name} with these arguments")


@upper.provide
class IteratorVariable(VariableTracker):
    """An iterator: ``next_item(tx)`` advances it by one item (None once exhausted).
    Consuming it whole advances it item by item, so whatever producing an item does (a
    generator's side effects, a ``map`` function's) happens in eager's order."""

    mutable = True

    def next_item(self, tx) -> VariableTracker | None:
        raise NotImplementedError

    def iter_var(self, tx):
        return self

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx):
        out = []
        while (item := self.next_item(tx)) is not None:
            out.append(item)
        return out


def iterate(tx, value: VariableTracker):
    """The items of ``iter(value)``, produced one at a time (a Python generator)."""
    it = tx.realize(value).iter_var(tx)
    while (item := it.next_item(tx)) is not None:
        yield item


def _iter_at(seq, index: int):
    """A list iterator positioned at ``index`` (rebuilding one after a graph break)."""
    it = iter(seq)
    it.__setstate__(index)
    return it


@upper.provide
class ListIteratorVariable(IteratorVariable):
    """An iterator over a list of items.  With ``seq`` (a list/tuple tracker) ``items`` is
    that tracker's own item list, read at each step as CPython's list iterator does."""

    def __init__(self, items: list[VariableTracker], index: int = 0, *,
                 seq: BaseSequenceVariable | None = None):
        super().__init__()
        self.items = items
        self.index = index
        self.seq = seq
        self.exhausted = False

    def children(self):
        if self.seq is not None:
            return [self.seq]
        return list(self.items[self.index:])

    def next_item(self, tx=None) -> VariableTracker | None:
        if self.exhausted or self.index >= len(self.items):
            self.exhausted = True  # CPython drops the list: items appended later are unseen
            return None
        item = self.items[self.index]
        self.index += 1
        return item

    def reconstruct(self, codegen):
        if self.seq is not None and isinstance(self.seq, ListVariable) and not self.exhausted:
            # the same live iterator over the (rebuilt) list, at the same position
            codegen.push_null()
            codegen.load_const_object(_iter_at)
            codegen(self.seq)
            codegen.load_const(self.index)
            codegen.call_function(2)
            return
        # iter((remaining items...)) rebuilds an equivalent iterator
        rest = [] if self.exhausted else self.items[self.index:]
        for item in rest:
            codegen(item)
        codegen.build_tuple(len(rest))
        codegen.get_iter()

    def describe(self) -> str:
        return f"ListIteratorVariable({self.index}/{len(self.items)})"


_VIEW_TYPES = {"keys": type({}.keys()), "values": type({}.values()),
               "items": type({}.items())}


def _view_item(container, kind: str, key: Any) -> VariableTracker:
    if kind == "keys":
        return key_var(key)
    if kind == "values":
        return container.items[key]
    return TupleVariable([key_var(key), container.items[key]])


class DictViewVariable(VariableTracker):
    """``d.keys()`` / ``d.values()`` / ``d.items()``: a live view of the dict tracker (a key
    added later is in it, its length follows the dict), as in eager."""

    mutable = True  # one object: aliases of it are rebuilt once

    def __init__(self, dict_var: ConstDictVariable, kind: str):
        super().__init__()
        self.dict = dict_var
        self.kind = kind

    def python_type(self) -> type:
        return _VIEW_TYPES[self.kind]

    def children(self):
        return [self.dict]

    def as_python_constant(self) -> Any:
        if self.kind == "keys":
            if has_identity_keys(self.dict.items):
                raise NotConstant("the keys of a dict keyed by modules")
            return dict.fromkeys(self.dict.items).keys()
        if self.kind == "items":
            return self.dict.as_python_constant().items()
        # values views compare by identity: a folded copy would not be the same object
        raise NotConstant(repr(self))

    def truth_value(self, tx) -> bool:
        return bool(self.dict.items)

    def len_value(self, tx) -> int:
        return len(self.dict.items)

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx):
        return [_view_item(self.dict, self.kind, k) for k in self.dict.items]

    def iter_var(self, tx):
        return DictIteratorVariable(self.dict, self.kind)

    def contains(self, tx, item: VariableTracker) -> VariableTracker:
        if self.kind == "values":
            return upper.contains_op(tx, TupleVariable(list(self.dict.items.values())), item)
        if self.kind == "keys":
            return ConstantVariable(dict_key(tx, item) in self.dict.items)
        pair = tx.unpack_sequence(item)
        if len(pair) != 2:
            return ConstantVariable(False)
        key = dict_key(tx, pair[0])
        if key not in self.dict.items:
            return ConstantVariable(False)
        return upper.contains_op(tx, TupleVariable([self.dict.items[key]]), pair[1])

    def reconstruct(self, codegen):
        codegen(self.dict)
        codegen.load_attr(self.kind)
        codegen.call_simple(0)

    def describe(self) -> str:
        return f"DictViewVariable({self.kind} of {self.dict.describe()})"


def _dict_iter_at(view, index: int):
    """An iterator over ``view`` that already gave ``index`` items."""
    it = iter(view)
    for _ in range(index):
        next(it)
    return it


class DictIteratorVariable(IteratorVariable):
    """Iterating a dict, one of its views or a set.  It iterates, for real, the Python dict
    (``ConstDictVariable.items``) or set (``SetVariable.shadow``) that received the same
    insertions and deletions as eager's object: the order and the RuntimeError of a
    container changed during iteration are CPython's own."""

    def __init__(self, container: VariableTracker, kind: str):
        super().__init__()
        self.container = container
        self.kind = kind
        real = container.shadow if isinstance(container, SetVariable) else container.items
        self.real = iter(real)
        self.index = 0
        self.size = len(real)
        self.exhausted = False

    def children(self):
        return [self.container]

    def next_item(self, tx) -> VariableTracker | None:
        if self.exhausted:
            return None
        try:
            key = next(self.real)
        except StopIteration:
            self.exhausted = True
            return None
        except RuntimeError as e:  # changed size (or keys) during iteration
            self.exhausted = True  # sticky, as in CPython
            raise_traced(RuntimeError, *e.args)
        self.index += 1
        return _view_item(self.container, self.kind, key)

    def reconstruct(self, codegen):
        if self.exhausted or len(self.container.items) != self.size:
            codegen.build_tuple(0)
            codegen.get_iter()
            return
        codegen.push_null()
        codegen.load_const_object(_dict_iter_at)
        codegen(self.container)
        if isinstance(self.container, ConstDictVariable):
            codegen.load_attr(self.kind)
            codegen.call_simple(0)
        codegen.load_const(self.index)
        codegen.call_function(2)

    def describe(self) -> str:
        return f"DictIteratorVariable({self.kind}, {self.index}/{self.size})"


class SliceVariable(VariableTracker):
    """``slice(start, stop, step)`` with parts that are not all constants."""

    def __init__(self, parts: list[VariableTracker]):
        super().__init__()
        self.parts = parts

    def children(self):
        return list(self.parts)

    def as_python_constant(self):
        return slice(*[p.as_python_constant() for p in self.parts])

    def as_proxy(self):
        return slice(*[p.as_proxy() for p in self.parts])

    def as_example(self):
        return slice(*[p.as_example() for p in self.parts])

    def reconstruct(self, codegen):
        for p in self.parts:
            codegen(p)
        codegen.build_slice(len(self.parts))


class NamedTupleMethodVariable(BoundMethodVariable):
    """``nt._replace(**changes)`` and ``nt._asdict()`` on a namedtuple tracker."""

    def call_function(self, tx, args, kwargs):
        fields = list(self.obj.tuple_cls._fields)
        if self.name == "_replace" and not args:
            items = list(self.obj.items)
            for k, v in kwargs.items():
                if k not in fields:
                    raise Unsupported(f"_replace() got an unexpected field name {k!r}")
                items[fields.index(k)] = v
            return TupleVariable(items, tuple_cls=self.obj.tuple_cls)
        if self.name == "_asdict" and not args and not kwargs:
            return ConstDictVariable(dict(zip(fields, self.obj.items, strict=True)))
        raise Unsupported(f"namedtuple.{self.name} with these arguments")


class TrackedKey:
    """A dict key or set item that is not a constant: the container keeps its tracker
    (``var``: what iterating gives, what a rebuilt container holds)."""

    __slots__ = ("var",)


class ItemById(TrackedKey):
    """A dict key or set item known by identity (an ``nn.Module`` whose class keeps
    ``object``'s ``__hash__`` and ``__eq__``; its identity is guarded by the module's own
    guard): it hashes as the object does, so the shadow set's table (and iteration) order
    is eager's, and equals only itself."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any, var: VariableTracker):
        self.obj = obj
        self.var = var

    def __hash__(self) -> int:
        return object.__hash__(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemById) and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} at {id(self.obj):#x}>"


class ItemByValue(TrackedKey):
    """A dict key or set item that hashes and compares by a tuple of constants, as an
    instance of a frozen dataclass made in the frame does (its generated ``__hash__`` is
    ``hash(fields)``; its ``__eq__`` compares the fields of two instances of one class).
    It hashes as the real object would, so a set's table order is eager's."""

    __slots__ = ("cls", "values")

    def __init__(self, cls: type, values: tuple, var: VariableTracker):
        self.cls = cls
        self.values = values
        self.var = var

    def __hash__(self) -> int:
        return hash(self.values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemByValue) and other.cls is self.cls and \
            other.values == self.values

    def __repr__(self) -> str:
        return f"{self.cls.__qualname__}{self.values!r}"


def hash_key(item: VariableTracker, what: str) -> Any:
    """The Python key a dict or set holds ``item`` under: a hashable constant as itself, a
    module hashed by identity as an ``ItemById``, a tracker that knows its value key
    (``value_key()``: a frozen dataclass instance) as that; anything else breaks the
    graph."""
    value_key = getattr(item, "value_key", None)
    if value_key is not None:
        key = value_key()
        if key is not None:
            return key
    try:
        key = item.as_python_constant()
        hash(key)
    except (NotConstant, TypeError):
        module = getattr(item, "module", None) if isinstance(item, upper.NNModuleVariable) else None
        if module is not None and type(module).__hash__ is object.__hash__ and \
                type(module).__eq__ is object.__eq__:
            return ItemById(module, item)
        raise Unsupported(f"{what} {item.describe()} is not a hashable constant") from None
    return key


def is_identity_key(obj: Any) -> bool:
    """A module that hashes and compares as ``object`` does (by identity)."""
    import torch

    return isinstance(obj, torch.nn.Module) and type(obj).__hash__ is object.__hash__ and \
        type(obj).__eq__ is object.__eq__


def key_var(key: Any) -> VariableTracker:
    """The tracker of a dict key (``hash_key``'s inverse)."""
    return key.var if isinstance(key, TrackedKey) else ConstantVariable.create(key)


def load_key(codegen, key: Any) -> None:
    """Push a dict key when rebuilding a dict (a module key is reloaded from its source)."""
    if isinstance(key, TrackedKey):
        codegen(key.var)
    else:
        codegen.load_const(key)


def has_identity_keys(items: Any) -> bool:
    return any(isinstance(k, TrackedKey) for k in items)


class TensorItem:
    """A tensor in a set.  Tensors hash by identity, and a graph value has no real object
    to hash: the set holds one ``TensorItem`` per tensor (``SetVariable.key_of`` finds a
    tensor's by ``is``, guarded between inputs), and its iteration order, which follows
    the real hashes, is unknown from then on."""

    __slots__ = ("var",)

    def __init__(self, var: VariableTracker):
        self.var = var

    def __repr__(self) -> str:
        return f"<tensor {self.var.node.name}>"


def _set_key(tx, item: VariableTracker) -> Any:
    return hash_key(item, "set item")


def dict_key(tx, key: VariableTracker) -> Any:
    return hash_key(tx.realize(key) if tx is not None else key, "dict key")


@upper.provide
@tracker_for(set)
class SetVariable(VariableTracker):
    """A set of constants (hashable values known at trace time)."""

    mutable = True

    def __init__(self, items: list[VariableTracker], *, source=None, tx=None):
        super().__init__(source=source)
        self.items: dict[Any, VariableTracker] = {}
        #: a real set that gets the same adds and removals: CPython iterates a set in
        #: table order (hashes, history), and ``items`` is kept in that order
        self.shadow: set = set()
        #: a tensor was in the set: the real table's order is not known (sticky, as the
        #: table keeps the history of removed items)
        self.order_unknown = False
        for it in items:
            key = self.key_of(tx, it)
            self.items.setdefault(key, it)
            self.shadow.add(key)
        self.resync()

    def key_of(self, tx, item: VariableTracker) -> Any:
        """The key ``item`` is (or would be) held under: a tensor is the one already in
        the set when ``is`` says so."""
        if isinstance(item, upper.TensorVariable):
            if tx is None:
                raise Unsupported("a tensor in a set built without a translator")
            for key in self.items:
                if isinstance(key, TensorItem) and \
                        upper.is_op(tx, key.var, item, negate=False).as_python_constant():
                    return key
            self.order_unknown = True
            return TensorItem(item)
        return _set_key(tx, item)

    def check_ordered(self, what: str) -> None:
        """Refuse what depends on the real table's order when it is unknown."""
        if self.order_unknown and len(self.items) > 1:
            raise Unsupported(f"{what} on a set that held a tensor (its order follows the "
                              "tensors' ids)")

    def has_tensor_items(self) -> bool:
        return any(isinstance(k, TensorItem) for k in self.items)

    def resync(self) -> None:
        """Put ``items`` in the iteration order of the real set (``shadow``)."""
        self.items = {k: self.items[k] for k in self.shadow}

    @classmethod
    def wrap(cls, builder, value):
        from .constant import is_constant_value

        if type(value) is not set or not all(is_constant_value(v) for v in value):
            raise Unsupported("set of non-constants")
        # a copy, compared with ``type(x) is set and x == copy`` (a frozenset never
        # passed the type test: the set recompiled on every call)
        builder.install_guard(GuardKind.CONSTANT_MATCH, set(value))
        var = cls([ConstantVariable.create(v) for v in value], source=builder.source)
        var.shadow = value.copy()  # the frame's set's own table order
        var.resync()
        return var

    def python_type(self) -> type:
        return set

    def as_python_constant(self) -> Any:
        if any(isinstance(k, TrackedKey) for k in self.shadow):
            raise NotConstant("a set of modules")
        if self.order_unknown and (self.has_tensor_items() or len(self.items) > 1):
            raise NotConstant("a set that held a tensor")
        return self.shadow.copy()  # (a copy keeps the table order: folded results match)

    def len_value(self, tx) -> int:
        return len(self.items)

    def contains(self, tx, item: VariableTracker) -> VariableTracker:
        """``item in s``: by value for constants, by identity for modules and tensors."""
        item = tx.realize(item)
        if isinstance(item, upper.TensorVariable):
            return ConstantVariable(any(
                isinstance(k, TensorItem) and
                upper.is_op(tx, k.var, item, negate=False).as_python_constant()
                for k in self.items))
        return ConstantVariable(_set_key(tx, item) in self.shadow)

    def truth_value(self, tx) -> bool:
        return bool(self.items)

    def iter_var(self, tx):
        self.check_ordered("iterating")
        return DictIteratorVariable(self, "values")

    def has_unpack_var_sequence(self, tx) -> bool:
        return True

    def unpack_var_sequence(self, tx):
        self.check_ordered("iterating")
        return list(self.items.values())

    def children(self):
        return list(self.items.values())

    def check_mutable(self, what: str) -> None:
        if self.source is not None:
            raise Unsupported(f"{what} on a set that came from the frame "
                              f"({self.source.name()}): side effects are not tracked yet")

    def add(self, tx, item: VariableTracker) -> None:
        self.check_mutable("set.add")
        key = self.key_of(tx, item)
        self.items.setdefault(key, item)
        self.shadow.add(key)
        self.resync()

    def var_getattr(self, tx, name):
        if name in ("add", "update", "discard", "remove", "clear", "copy", "union",
                    "intersection", "difference", "issubset", "issuperset", "isdisjoint",
                    "symmetric_difference", "pop"):
            return SetMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a set")

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        for item in self.items.values():
            codegen(item)
        from ...bytecode import create_instruction

        codegen.append(create_instruction("BUILD_SET", arg=len(self.items)))

    def describe(self) -> str:
        return f"SetVariable({sorted(map(repr, self.items))})"


class SetMethodVariable(BoundMethodVariable):
    def call_function(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        if kwargs:
            raise Unsupported(f"set.{name} with keyword arguments")
        none = ConstantVariable(None)
        if name == "add" and len(args) == 1:
            obj.add(tx, args[0])
            return none
        if name == "update":
            for a in args:
                for it in iterate(tx, a):
                    obj.add(tx, it)
            return none
        if name in ("discard", "remove") and len(args) == 1:
            obj.check_mutable(f"set.{name}")
            key = obj.key_of(tx, tx.realize(args[0]))
            if key not in obj.items and name == "remove":
                if isinstance(key, TensorItem):
                    raise Unsupported("KeyError for a tensor not in a set")
                raise_traced(KeyError, key)
            obj.items.pop(key, None)
            obj.shadow.discard(key)
            obj.resync()
            return none
        if name == "clear" and not args:
            obj.check_mutable("set.clear")
            obj.items.clear()
            obj.shadow.clear()
            return none
        if name == "copy" and not args:  # (the real copy's table: iteration and pop)
            copy = SetVariable([])
            copy.items = dict(obj.items)
            copy.shadow = obj.shadow.copy()
            copy.order_unknown = obj.order_unknown
            copy.resync()
            return copy
        if name == "pop" and not args and obj.items:
            # the item the real set gives: the shadow has its table and its pop position
            # (a frame-built set: one from the frame is refused by check_mutable)
            obj.check_mutable("set.pop")
            obj.check_ordered("set.pop")
            key = obj.shadow.pop()
            value = obj.items.pop(key)
            obj.resync()
            return value
        if name == "pop":
            raise Unsupported("set.pop of an empty set or with arguments")
        if obj.order_unknown:
            raise Unsupported(f"set.{name} of a set that held a tensor")
        try:
            cargs = [set(_set_key(tx, it) for it in tx.unpack_sequence(a)) for a in args]
        except Unsupported:
            raise
        from .constant import wrap_constant_result

        return wrap_constant_result(getattr(obj.as_python_constant(), name)(*cargs),
                                    what=f"set.{name}")
