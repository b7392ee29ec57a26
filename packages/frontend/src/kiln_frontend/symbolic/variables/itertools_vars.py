"""``itertools`` iterators and ``operator.itemgetter``/``attrgetter``/``methodcaller``
built inside a frame (issue 27): registered constructors in ``stdlib.CLASS_CONSTRUCTORS``.

Why it works without re-implementing itertools: the structural ones (chain, islice,
product, combinations, pairwise...) never look at their items, so the real itertools
function is run over *trackers*; the ones that call a function (accumulate, starmap,
takewhile, groupby...) get a Python callable that traces the call.  Items are produced
lazily (``next_item``), so what producing them does happens in eager's order.  Such an
iterator still alive at a graph break is not rebuilt: a clean graph break of the frame."""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

from ...exc import Unsupported
from .base import BoundMethodVariable, NotConstant, VariableTracker, constant_or_break
from .constant import ConstantVariable
from .containers import IteratorVariable, ListIteratorVariable, ListVariable, TupleVariable
from .stdlib import register_builtin, register_constructor


class TracedIteratorVariable(IteratorVariable):
    """An itertools iterator over trackers; ``make(cell)`` gives the Python iterator,
    which reads the current translator from ``cell[0]``."""

    def __init__(self, cls: type, make: Callable[[list], Iterator[VariableTracker]],
                 parts: list[VariableTracker], tx: Any, cell: list[Any] | None = None):
        super().__init__()
        self.cls = cls
        # (product, combinations... read their input at once); iterators sharing an input
        # (tee's) share the cell
        self.cell: list[Any] = [tx] if cell is None else cell
        self.it = make(self.cell)
        self.parts = parts

    def python_type(self) -> type:
        return self.cls

    def children(self):
        return list(self.parts)

    def next_item(self, tx) -> VariableTracker | None:
        self.cell[0] = tx
        return next(self.it, None)

    def reconstruct(self, codegen) -> None:
        raise Unsupported(f"an itertools.{self.cls.__name__} iterator made while tracing "
                          "is alive at a graph break")

    def describe(self) -> str:
        return f"TracedIteratorVariable({self.cls.__name__})"


def _items(cell: list, vt: VariableTracker) -> Iterator[VariableTracker]:
    tx = cell[0]
    it = tx.realize(vt).iter_var(tx)
    while (item := it.next_item(cell[0])) is not None:
        yield item


def _const(vt: VariableTracker | None, what: str) -> Any:
    if vt is None:
        return None
    return constant_or_break(vt, f"itertools.{what} with a non-constant count")


def _tuple(t: tuple) -> VariableTracker:
    return TupleVariable(list(t))


def _call(cell: list, fn: VariableTracker, *args: VariableTracker) -> VariableTracker:
    tx = cell[0]
    return tx.realize(tx.call_function(fn, list(args), {}))


def _truth(cell: list, vt: VariableTracker) -> bool:
    return cell[0].realize(vt).truth_value(cell[0])


def _fn_var(tx, fn: Any) -> VariableTracker:
    from .builder import VariableBuilder

    return VariableBuilder(tx, None, guard=False)(fn)


def _construct(cls: type, build: Callable[..., Callable[[list], Iterator]]) -> None:
    """Register ``cls(*args, **kwargs)`` as a TracedIteratorVariable; ``build(tx, *args,
    **kwargs)`` returns ``make(cell)`` (or raises TypeError on a signature it refuses)."""

    def construct(tx, _cls, args, kwargs):
        try:
            make = build(tx, *args, **kwargs)
        except TypeError as e:
            raise Unsupported(f"itertools.{cls.__name__} called as {e}") from None
        return TracedIteratorVariable(cls, make, [*args, *kwargs.values()], tx)

    register_constructor(cls, construct)


_construct(itertools.chain, lambda tx, *its: lambda c: itertools.chain(
    *[_items(c, i) for i in its]))
_construct(itertools.islice, lambda tx, it, *bounds: lambda c: itertools.islice(
    _items(c, it), *[_const(b, "islice") for b in bounds]))
_construct(itertools.repeat, lambda tx, obj, times=None: lambda c: (
    itertools.repeat(obj) if times is None else itertools.repeat(obj, _const(times, "repeat"))))
_construct(itertools.count, lambda tx, start=None, step=None: lambda c: map(
    ConstantVariable, itertools.count(_const(start, "count") or 0,
                                      1 if step is None else _const(step, "count"))))
_construct(itertools.cycle, lambda tx, it: lambda c: itertools.cycle(_items(c, it)))
_construct(itertools.pairwise, lambda tx, it: lambda c: map(
    _tuple, itertools.pairwise(_items(c, it))))
_construct(itertools.zip_longest, lambda tx, *its, fillvalue=None: lambda c: map(
    _tuple, itertools.zip_longest(*[_items(c, i) for i in its],
                                  fillvalue=fillvalue or ConstantVariable(None))))
_construct(itertools.product, lambda tx, *its, repeat=None: lambda c: map(
    _tuple, itertools.product(*[list(_items(c, i)) for i in its],
                              repeat=1 if repeat is None else _const(repeat, "product"))))
for _combi in (itertools.combinations, itertools.combinations_with_replacement):
    _construct(_combi, lambda tx, it, r, _f=_combi: lambda c: map(
        _tuple, _f(_items(c, it), _const(r, _f.__name__))))
_construct(itertools.permutations, lambda tx, it, r=None: lambda c: map(
    _tuple, itertools.permutations(_items(c, it), _const(r, "permutations"))))
_construct(itertools.starmap, lambda tx, fn, it: lambda c: (
    _call(c, fn, *c[0].unpack_sequence(args)) for args in _items(c, it)))
_construct(itertools.takewhile, lambda tx, fn, it: lambda c: itertools.takewhile(
    lambda v: _truth(c, _call(c, fn, v)), _items(c, it)))
_construct(itertools.dropwhile, lambda tx, fn, it: lambda c: itertools.dropwhile(
    lambda v: _truth(c, _call(c, fn, v)), _items(c, it)))
_construct(itertools.filterfalse, lambda tx, fn, it: lambda c: itertools.filterfalse(
    lambda v: _truth(c, v if fn.is_python_constant() and fn.as_python_constant() is None
                     else _call(c, fn, v)), _items(c, it)))



def _compress(c, data, selectors):
    for item, selector in zip(_items(c, data), _items(c, selectors)):  # noqa: B905 (as compress)
        if _truth(c, selector):
            yield item


_construct(itertools.compress, lambda tx, data, selectors: lambda c: _compress(c, data, selectors))


def _chain_from_iterable(tx, args, kwargs):
    """``chain.from_iterable(its)``: reads ``its`` lazily, one inner iterable at a time."""
    if len(args) != 1 or kwargs:
        return None
    its = args[0]
    return TracedIteratorVariable(itertools.chain, lambda c: itertools.chain.from_iterable(
        _items(c, inner) for inner in _items(c, its)), [its], tx)


def _tee(tx, args, kwargs):
    """``tee(it, n)``: the real tee over one lazy reader of ``it``; the n iterators share
    the reader's translator cell (whichever advances first reads the input)."""
    if not 1 <= len(args) <= 2 or kwargs:
        return None
    n = _const(args[1], "tee") if len(args) == 2 else 2
    if not isinstance(n, int) or n < 0:
        return None  # eager's errors
    cell: list[Any] = [tx]
    tees = itertools.tee(_items(cell, args[0]), n)
    return TupleVariable([TracedIteratorVariable(type(t), lambda c, t=t: t, [args[0]], tx, cell)
                          for t in tees])


def callable_iterator(tx, fn, sentinel):
    """``iter(fn, sentinel)``: calls ``fn`` until it returns the sentinel; both compared as
    constants (a tensor's ``==`` is not a Python bool)."""
    stop = _const(sentinel, "iter(callable, sentinel)")

    def make(c):
        while True:
            v = c[0].realize(_call(c, fn))
            try:
                value = v.as_python_constant()
            except NotConstant:
                raise Unsupported("iter(callable, sentinel) where the callable returns "
                                  f"{v.describe()}, not a constant") from None
            if value == stop:
                return
            yield v

    return TracedIteratorVariable(type(iter(int, 0)), make, [fn, sentinel], tx)


def _accumulate(tx, it, func=None, *, initial=None):
    fn = func if func is not None and not (func.is_python_constant() and
                                          func.as_python_constant() is None) \
        else _fn_var(tx, operator.add)
    init = None if initial is None or (initial.is_python_constant() and
                                       initial.as_python_constant() is None) else initial
    return lambda c: itertools.accumulate(_items(c, it), lambda a, b: _call(c, fn, a, b),
                                          initial=init)


_construct(itertools.accumulate, _accumulate)


def _groupby(tx, it, key=None):
    """Keys are compared in Python, so they must be constants (or the items themselves)."""
    def make(c):
        def keyed(v):
            k = v if key is None or (key.is_python_constant() and
                                    key.as_python_constant() is None) else _call(c, key, v)
            try:
                return c[0].realize(k).as_python_constant()
            except NotConstant:
                raise Unsupported("itertools.groupby with keys that are not constants") \
                    from None

        for k, group in itertools.groupby(_items(c, it), keyed):
            yield TupleVariable([ConstantVariable.create(k), ListIteratorVariable(list(group))])

    return make


_construct(itertools.groupby, _groupby)


# -- operator.itemgetter / attrgetter / methodcaller ----------------------------------------------

class OperatorGetterVariable(VariableTracker):
    """``operator.itemgetter(*keys)``, ``attrgetter(*names)``, ``methodcaller(name, ...)``
    with constant arguments: calling it traces the item/attribute/method access."""

    def __init__(self, value: Any, kind: type, args: list[Any], kwargs: dict[str, Any]):
        super().__init__()
        self.value = value  # the real object (rebuilt as a constant)
        self.kind = kind
        self.args = args
        self.kwargs = kwargs

    def python_type(self) -> type:
        return self.kind

    def as_python_constant(self) -> Any:
        return self.value

    def call_function(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported(f"operator.{self.kind.__name__} object called with "
                              f"{len(args)} arguments")
        obj = tx.realize(args[0])
        if self.kind is operator.methodcaller:
            name, *margs = self.args
            return obj.call_method(tx, name, [ConstantVariable.create(a) for a in margs],
                                   {k: ConstantVariable.create(v)
                                    for k, v in self.kwargs.items()})
        results = []
        for key in self.args:
            if self.kind is operator.itemgetter:
                results.append(tx.getitem(obj, ConstantVariable.create(key)))
            else:
                r = obj
                for part in key.split("."):
                    r = tx.realize(r).var_getattr(tx, part)
                results.append(r)
        return results[0] if len(results) == 1 else TupleVariable(results)

    def reconstruct(self, codegen) -> None:
        codegen.load_const_object(self.value)

    def describe(self) -> str:
        return f"OperatorGetterVariable({self.value!r})"


def _getter(kind: type):
    def construct(tx, _cls, args, kwargs):
        try:
            cargs = [a.as_python_constant() for a in args]
            ckw = {k: v.as_python_constant() for k, v in kwargs.items()}
        except NotConstant:
            raise Unsupported(f"operator.{kind.__name__} with non-constant arguments") \
                from None
        return OperatorGetterVariable(kind(*cargs, **ckw), kind, cargs, ckw)

    return construct


for _kind in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
    register_constructor(_kind, _getter(_kind))


# -- collections.deque built in the frame -------------------------------------------------------

class DequeVariable(ListVariable):
    """``collections.deque(iterable, maxlen)`` made in the frame: a list tracker whose
    methods add the deque ones (``appendleft``, ``popleft``, ``extendleft``, ``rotate``) and
    keep ``maxlen`` (items fall off the other end); rebuilt as ``deque([...], maxlen)``.
    A deque from the frame's arguments stays an opaque object (a graph break on use)."""

    python_cls = collections.deque

    def __init__(self, items: list[VariableTracker], maxlen: int | None):
        super().__init__(items)
        self.maxlen = maxlen

    def as_python_constant(self) -> Any:
        return collections.deque((i.as_python_constant() for i in self.items), self.maxlen)

    def _trim(self, left: bool) -> None:
        """After adding on the right (``left`` False) drop from the left, and vice versa."""
        if self.maxlen is not None:
            while len(self.items) > self.maxlen:
                self.items.pop(0 if not left else -1)

    def var_getattr(self, tx, name):
        if name in ("append", "appendleft", "pop", "popleft", "extend", "extendleft",
                    "clear", "rotate", "count", "index", "reverse"):
            return DequeMethodVariable(self, name)
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        raise Unsupported(f"attribute {name!r} of a deque")

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        if not isinstance(index.as_python_constant() if index.is_python_constant() else None,
                          int):
            raise Unsupported("deque indexed by other than an int (eager: TypeError)")
        return super().getitem(tx, index)

    def setitem(self, tx, index, value) -> None:
        raise Unsupported("deque item assignment")

    def reconstruct(self, codegen) -> None:
        codegen.push_null()
        codegen.load_const_object(collections.deque)
        self.reconstruct_items(codegen)
        codegen.build_list(len(self.items))
        codegen.load_const(self.maxlen)
        codegen.call_function(2)

    def describe(self) -> str:
        return f"DequeVariable({len(self.items)}, maxlen={self.maxlen})"


class DequeMethodVariable(BoundMethodVariable):
    """``d.appendleft`` and friends on a DequeVariable."""

    def call_function(self, tx, args, kwargs):
        d, name, none = self.obj, self.name, ConstantVariable(None)
        if kwargs:
            raise Unsupported(f"deque.{name} with keyword arguments")
        if name in ("append", "appendleft") and len(args) == 1:
            d.items.insert(len(d.items) if name == "append" else 0, args[0])
            d._trim(left=name == "appendleft")
            return none
        if name in ("extend", "extendleft") and len(args) == 1:
            for item in list(_items([tx], args[0])):
                d.items.insert(len(d.items) if name == "extend" else 0, item)
                d._trim(left=name == "extendleft")
            return none
        if name in ("pop", "popleft") and not args:
            if not d.items:
                from .raising import raise_traced

                raise_traced(IndexError, "pop from an empty deque")
            return d.items.pop(-1 if name == "pop" else 0)
        if name == "rotate" and len(args) <= 1:
            n = _const(args[0], "rotate") if args else 1
            if d.items:
                n %= len(d.items)
                d.items[:] = d.items[-n:] + d.items[:-n] if n else d.items
            return none
        if name in ("clear", "reverse", "count", "index"):
            from .containers import SequenceMethodVariable

            return SequenceMethodVariable(d, name).call_function(tx, args, kwargs)
        raise Unsupported(f"deque.{name} with these arguments")

    def describe(self) -> str:
        return f"deque.{self.name}"


def _deque(tx, _cls, args, kwargs):
    if len(args) + len(kwargs) > 2 or set(kwargs) - {"iterable", "maxlen"}:
        return None
    iterable = args[0] if args else kwargs.get("iterable")
    maxlen_vt = args[1] if len(args) > 1 else kwargs.get("maxlen")
    maxlen = _const(maxlen_vt, "deque") if maxlen_vt is not None else None
    if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 0):
        return None  # eager's errors
    d = DequeVariable([], maxlen)
    if iterable is not None:
        for item in list(_items([tx], iterable)):
            d.items.append(item)
            d._trim(left=False)
    return d


register_constructor(collections.deque, _deque)
register_builtin(itertools.chain.from_iterable, _chain_from_iterable)
register_builtin(itertools.tee, _tee)
