"""``operator.<fn>(*args)`` on trackers: what BINARY_OP, COMPARE_OP, ``is``, ``in``,
subscripts and the ``operator`` module's functions mean while tracing.

``call_operator`` consults, in order:

1. ``ON_ANY_OPERANDS``: operators whose meaning does not depend on what the operands are
   (``is``, ``in``, ``[]``, ``not``);
2. a user object whose class defines the operator in Python (``__add__``/``__radd__``,
   ``__eq__``, ``__neg__``...): that method inlined, in the data model's order;
3. a tensor operand: a graph node; a symbolic size: a symbolic expression (shapes.py);
4. ``ON_PYTHON_VALUES``: what ``+``, ``*``, ``==`` mean on Python containers and objects
   (a handler returns None when the operands are not its kind);
5. folding on constants, a graph break naming the operator otherwise.

Also the helpers that builtins share with operators: ``constant_args``, ``known_object``,
``has_tensor``."""

from __future__ import annotations

import operator
from typing import Any

from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, sym_and

from ...exc import Unsupported
from ...guards import Guard, GuardKind
from ...layers import upper
from .base import NotConstant, VariableTracker
from .constant import (
    BINARY_OPERATORS,
    COMPARE_OPERATORS,
    ConstantVariable,
    wrap_constant_result,
)
from .handler_table import HandlerTable

#: every operator function ``call_operator`` knows (a BuiltinVariable of one calls it)
OPERATOR_FUNCTIONS = frozenset(
    set(BINARY_OPERATORS.values()) | set(COMPARE_OPERATORS.values()) | {
        operator.neg, operator.pos, operator.invert, operator.not_, operator.abs,
        operator.getitem, operator.contains, operator.is_, operator.is_not, operator.truth,
        operator.index,
    })

#: operators that can become graph nodes when a tensor is involved
_TENSOR_OPERATORS = frozenset(
    set(BINARY_OPERATORS.values()) | set(COMPARE_OPERATORS.values()) | {
        operator.neg, operator.pos, operator.invert, operator.abs, operator.getitem,
    })

#: in-place operator -> the operator it means when its left operand is not a tensor
_OUT_OF_PLACE: dict[Any, Any] = {
    BINARY_OPERATORS[sym + "="]: BINARY_OPERATORS[sym]
    for sym in ("+", "&", "//", "<<", "@", "*", "%", "|", "**", ">>", "-", "/", "^")
}

#: handler(tx, fn, args) -> tracker, for any operands
ON_ANY_OPERANDS = HandlerTable("operators on any operands")
#: handler(tx, fn, args) -> tracker or None (not these operands), after tensors and sizes
ON_PYTHON_VALUES = HandlerTable("operators on Python values")


def constant_args(args, kwargs, what: str) -> tuple[list[Any], dict[str, Any]]:
    """The Python values of constant arguments; ``Unsupported`` naming ``what`` otherwise."""
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except NotConstant:
        raise Unsupported(f"{what} with non-constant arguments") from None


def known_object(v: VariableTracker) -> Any:
    """The real object behind a tracker when it is known (modules, functions, constants,
    classes).  A tracker's ``cls`` is that object only for a class tracker: elsewhere it is
    the class of an object made while tracing, an exception, a ``super()``..., and taking
    it for the object made ``G() is G`` and ``hasattr(G(), n)`` answer for the class."""
    from .misc import UserDefinedClassVariable

    for attr in ("module", "value", "fn"):
        obj = getattr(v, attr, None)
        if obj is not None:
            return obj
    if isinstance(v, UserDefinedClassVariable):
        return v.cls
    return None


def has_tensor(args) -> bool:
    from .tensor import TensorVariable

    return any(isinstance(a, TensorVariable) for a in args)


def call_operator(tx, fn, args, kwargs) -> VariableTracker:
    """``operator.<fn>(*args)`` on trackers (also what BINARY_OP / COMPARE_OP use)."""
    if kwargs:
        raise Unsupported(f"operator.{fn.__name__} with keyword arguments")
    handler = ON_ANY_OPERANDS.get(fn)
    if handler is not None:
        return handler(tx, fn, args)
    from .numpy_arrays import has_array, numpy_operator

    if has_array(args):  # NumPy arrays: torch._numpy's operator in the graph
        return numpy_operator(tx, fn, args)
    data_model = python_data_model(tx, fn, args)
    if data_model is not None:  # a user class's own __add__, __eq__, __neg__...
        return data_model
    if has_tensor(args):
        return _tensor_operator(tx, fn, args)
    from ...shapes import SYM_OPERATORS, has_symnode, sym_operator

    if has_symnode(args) and fn in SYM_OPERATORS:  # arithmetic on symbolic sizes
        # ``n += 1`` on a symbolic int is ``n + 1`` (ints are immutable): FX prints an
        # in-place node as ``iadd += 1``, rebinding the name an earlier value lives under
        # (``a = n; n += 1`` then read a as the new n: a silent wrong result)
        return sym_operator(tx, _OUT_OF_PLACE.get(fn, fn), list(args))
    handler = ON_PYTHON_VALUES.get(fn)
    if handler is not None:
        result = handler(tx, fn, args)
        if result is not None:
            return result
    name = getattr(fn, "__name__", repr(fn))
    _no_fold_in_place(tx, fn, args)
    cargs, _ = constant_args(args, {}, f"operator.{name}")
    try:
        result = fn(*cargs)
    except Exception as e:  # noqa: BLE001
        from .raising import raise_traced_from

        raise_traced_from(e, f"operator.{name}")
    return wrap_constant_result(result, what=f"operator.{name}")


def _tensor_operator(tx, fn, args) -> VariableTracker:
    if fn not in _TENSOR_OPERATORS:
        raise Unsupported(f"operator.{getattr(fn, '__name__', repr(fn))} on a tensor")
    if fn in _OUT_OF_PLACE and not has_tensor(args[:1]):
        # ``n += t`` with a Python number ``n`` rebinds n to ``n + t``; FX would print
        # the in-place form as ``0 += t``, which is not Python
        fn = _OUT_OF_PLACE[fn]
    return tx.output.create_graph_op("call_function", fn, list(args), {})


# -- Python's data model: operators a user class defines ---------------------------------

#: binary operator -> (method, reflected method)
_BINARY_DUNDERS: dict[Any, tuple[str, str]] = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
    operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
    operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
    operator.rshift: ("__rshift__", "__rrshift__"),
}
#: rich comparison -> (method, reflected method); the reflected one is tried for equal types
_COMPARE_DUNDERS: dict[Any, tuple[str, str]] = {
    operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
    operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"),
    operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__"),
}
_UNARY_DUNDERS = {operator.neg: "__neg__", operator.pos: "__pos__",
                  operator.invert: "__invert__", operator.abs: "__abs__"}


def _is_user_object(v: VariableTracker) -> bool:
    from .misc import PythonProtocolMixin

    return isinstance(v, PythonProtocolMixin)


def _dunder(v: VariableTracker, name: str):
    from .misc import python_dunder

    return python_dunder(v.python_type(), name) if _is_user_object(v) else None


def _is_not_implemented(v: VariableTracker) -> bool:
    return v.is_python_constant() and v.as_python_constant() is NotImplemented


def python_data_model(tx, fn, args) -> VariableTracker | None:
    """``fn(*args)`` where an operand is a user object whose class defines the operator
    in Python: the methods inlined in CPython's order (the reflected method first for a
    right operand whose type subclasses the left's and overrides it; in-place, then
    binary; ``NotImplemented`` moves on). None when no operand has such a method."""
    if not any(_is_user_object(a) for a in args):
        return None
    if fn in _UNARY_DUNDERS:
        name = _UNARY_DUNDERS[fn]
        return args[0]._call_dunder(tx, name, []) if _dunder(args[0], name) else None
    if len(args) != 2:
        return None
    a, b = args
    inplace = fn in _OUT_OF_PLACE
    if inplace:
        name = "__i" + _BINARY_DUNDERS[_OUT_OF_PLACE[fn]][0][2:]
        if _dunder(a, name) is not None:
            result = a._call_dunder(tx, name, [b])
            if not _is_not_implemented(result):
                return result
        fn = _OUT_OF_PLACE[fn]
    compare = fn in _COMPARE_DUNDERS
    names = _COMPARE_DUNDERS.get(fn) or _BINARY_DUNDERS.get(fn)
    if names is None:
        return None
    forward, reflected = names
    calls = []
    if _dunder(a, forward) is not None:
        calls.append((a, forward, b))
    if _dunder(b, reflected) is not None and (compare or a.python_type() is not
                                              b.python_type()):
        call = (b, reflected, a)
        ta, tb = a.python_type(), b.python_type()
        if tb is not ta and issubclass(tb, ta) and \
                _dunder(b, reflected) is not _dunder(a, reflected):
            calls.insert(0, call)
        else:
            calls.append(call)
    if not calls and fn is operator.ne and (_dunder(a, "__eq__") or _dunder(b, "__eq__")):
        # object.__ne__ inverts __eq__ (unless NotImplemented)
        result = python_data_model(tx, operator.eq, args)
        try:
            return ConstantVariable(not result.as_python_constant())
        except NotConstant:
            raise Unsupported("!= through a __eq__ that returned a non-constant") from None
    if not calls:
        return None
    for obj, name, other in calls:
        result = obj._call_dunder(tx, name, [other])
        if not _is_not_implemented(result):
            return result
    if fn in (operator.eq, operator.ne):  # object's default: identity
        return is_op(tx, a, b, negate=fn is operator.ne)
    from .raising import raise_traced

    symbol = {v: k for k, v in BINARY_OPERATORS.items()}.get(fn, fn.__name__)
    raise_traced(TypeError, f"unsupported operand type(s) for {symbol}: "
                            f"'{a.python_type().__name__}' and '{b.python_type().__name__}'")


# -- operators on any operands ----------------------------------------------------------


@ON_ANY_OPERANDS.register(operator.is_, operator.is_not)
def _identity_test(tx, fn, args):
    return is_op(tx, args[0], args[1], negate=fn is operator.is_not)


@ON_ANY_OPERANDS.register(operator.contains)
def _membership(tx, fn, args):
    return contains_op(tx, args[1], args[0])


@ON_ANY_OPERANDS.register(operator.getitem)
def _subscript(tx, fn, args):
    return tx.getitem(args[0], args[1])


@ON_ANY_OPERANDS.register(operator.not_, operator.truth)
def _truth(tx, fn, args):
    truth = args[0].truth_value(tx)
    return ConstantVariable(not truth if fn is operator.not_ else truth)


# -- operators on Python containers and objects -------------------------------------------


@ON_PYTHON_VALUES.register(operator.add, operator.iadd)
def _concatenate(tx, fn, args):
    from .containers import BaseSequenceVariable, ListVariable, TupleVariable

    if len(args) != 2:
        return None
    a, b = args
    if fn is operator.iadd and isinstance(a, ListVariable):
        # ``lst += iterable`` is lst.extend(iterable): in place, any iterable
        return _call_list_method(tx, a, "extend", b)
    if not (isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable)
            and a.python_cls is b.python_cls):
        return None
    return type(a)(a.items + b.items) if isinstance(a, ListVariable) else \
        TupleVariable(a.items + b.items)


@ON_PYTHON_VALUES.register(operator.mul, operator.imul)
def _repeat(tx, fn, args):
    from .containers import BaseSequenceVariable, ListVariable, TupleVariable

    if len(args) != 2:
        return None
    a, b = args
    if not (isinstance(a, BaseSequenceVariable) or isinstance(b, BaseSequenceVariable)):
        return None
    seq, n = (a, b) if isinstance(a, BaseSequenceVariable) else (b, a)
    try:
        times = n.as_python_constant()
    except NotConstant:
        raise Unsupported("repeating a sequence a non-constant number of times") from None
    if fn is operator.imul and seq is a and isinstance(a, ListVariable):
        a.check_mutable("list *=")  # in place: aliases of the list see it
        a.items[:] = a.items * times
        return a
    items = seq.items * times
    return ListVariable(items) if isinstance(seq, ListVariable) else TupleVariable(items)


def _call_list_method(tx, lst, name: str, arg: VariableTracker) -> VariableTracker:
    from .containers import SequenceMethodVariable

    SequenceMethodVariable(lst, name).call_function(tx, [arg], {})
    return lst


_SET_OPERATORS = (operator.or_, operator.and_, operator.sub, operator.xor)
_SET_INPLACE = (operator.ior, operator.iand, operator.isub, operator.ixor)


@ON_PYTHON_VALUES.register(*_SET_OPERATORS, *_SET_INPLACE)
def _set_operator(tx, fn, args):
    """``s |= t`` and friends change ``s`` itself (its aliases see it), as in eager; the
    plain operators make a new set. Run on the real sets (SetVariable.shadow), so the
    result iterates in eager's order."""
    from .containers import ConstDictVariable, SetVariable

    if len(args) == 2 and isinstance(args[0], ConstDictVariable) and \
            fn in (operator.or_, operator.ior):
        return _dict_merge(tx, fn, args)
    if len(args) != 2 or not isinstance(args[0], SetVariable):
        return None
    a, b = args
    if a.order_unknown:
        raise Unsupported(f"set {fn.__name__} on a set that held a tensor")
    try:
        other = b.as_python_constant()
    except NotConstant:
        raise Unsupported(f"set operator with {b.describe()}") from None
    if not isinstance(other, (set, frozenset)):
        return None  # folded: eager's TypeError (or a dict view's reflected operator)
    if fn in _SET_INPLACE:
        a.check_mutable(f"set {fn.__name__}")
        fn(a.shadow, other)  # in place on the real set
        a.items = {k: a.items[k] if k in a.items else ConstantVariable.create(k)
                   for k in a.shadow}
        return a
    return wrap_constant_result(fn(a.shadow, other), what=f"set {fn.__name__}")


def _dict_merge(tx, fn, args):
    """``d | e`` (a new dict) and ``d |= e`` (``d`` itself updated)."""
    from .containers import ConstDictVariable

    a, b = args
    if fn is operator.ior:
        from .containers import DictMethodVariable

        DictMethodVariable(a, "update").call_function(tx, [b], {})
        return a
    if not isinstance(b, ConstDictVariable):
        return None
    return ConstDictVariable({**a.items, **b.items}, dict_cls=a.dict_cls)


def _no_fold_in_place(tx, fn, args) -> None:
    """An in-place operator on a mutable container that no handler took: folding it would
    change a copy, not the object (its aliases would not see it)."""
    if fn in _OUT_OF_PLACE and args and args[0].mutable:
        raise Unsupported(f"operator.{fn.__name__} on {args[0].describe()}")


@ON_PYTHON_VALUES.register(operator.eq, operator.ne)
def _equality_of_objects(tx, fn, args):
    """``==`` between objects known by identity (modules, functions): their identity."""
    from .containers import BaseSequenceVariable, ConstDictVariable

    if len(args) != 2:
        return None
    a, b = args
    if a.is_python_constant() and b.is_python_constant():
        return None
    if isinstance(a, upper.ObjectIdVariable) or isinstance(b, upper.ObjectIdVariable):
        # ids of objects made while tracing: equal only for the same object (any other
        # int, an id from before this call included, differs while both objects live)
        both = isinstance(a, upper.ObjectIdVariable) and isinstance(b, upper.ObjectIdVariable)
        if not both and (a if isinstance(a, upper.ObjectIdVariable) else b).obj.source is not None:
            # an input's id may equal an int from before the call
            raise Unsupported("comparing the id of an input with another value")
        same = both and (a.obj is b.obj or
                         is_op(tx, a.obj, b.obj, negate=False).as_python_constant())
        return ConstantVariable(same if fn is operator.eq else not same)
    if isinstance(a, (BaseSequenceVariable, ConstDictVariable)) or isinstance(
            b, (BaseSequenceVariable, ConstDictVariable)):
        same = _containers_equal(tx, a, b)
        return ConstantVariable(same if fn is operator.eq else not same)
    ia = known_object(a)
    ib = known_object(b)
    if ia is None or ib is None:
        return None
    same = ia is ib
    return ConstantVariable(same if fn is operator.eq else not same)


def _containers_equal(tx, a, b) -> bool:
    """``a == b`` for lists, tuples and dicts as CPython compares them: different kinds or
    lengths differ; items are the same object (identity first, so ``[t] == [t]`` holds for a
    tensor ``t`` without comparing its values) or equal constants; anything else is a
    graph break."""
    from .containers import BaseSequenceVariable, ConstDictVariable

    if isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable):
        if a.python_cls is not b.python_cls:
            return False
        if len(a.items) != len(b.items):
            return False
        pairs = list(zip(a.items, b.items, strict=True))
    elif isinstance(a, ConstDictVariable) and isinstance(b, ConstDictVariable):
        if a.items.keys() != b.items.keys():
            return False
        pairs = [(a.items[k], b.items[k]) for k in a.items]
    else:
        raise Unsupported(f"comparing {a.describe()} with {b.describe()}")
    sym_pairs: list[Any] = []  # SymBools of symbolic size items, checked last and once
    for x, y in pairs:
        x, y = tx.realize(x), tx.realize(y)
        if x is y:
            continue
        if x.is_python_constant() and y.is_python_constant():
            if x.as_python_constant() == y.as_python_constant():
                continue
            return False
        if isinstance(x, (BaseSequenceVariable, ConstDictVariable)) and \
                isinstance(y, (BaseSequenceVariable, ConstDictVariable)):
            if _containers_equal(tx, x, y):
                continue
            return False
        symbolic = _symbolic_size_equality(x, y)
        if symbolic is None:
            raise Unsupported("comparing containers with non-constant items")
        sym_pairs.append(symbolic)
    if not sym_pairs:
        return True
    return _guarded_truth(sym_and(*sym_pairs))


def _symbolic_size_equality(x, y) -> Any:
    """``s0 == s1`` (or ``s0 == 3``) as a SymBool, for items of sizes under dynamic shapes
    (``a.shape == b.shape``); None when an item is neither a symbolic nor a constant int.
    The items' equalities are and-ed before the ShapeEnv is asked once, as torch.compile
    does: the guard it records is the whole comparison's (``(2, 5) != (2, 3)`` then keeps
    the entry made for ``(3, 2) != (2, 3)``)."""
    from ...shapes import SymNodeVariable

    if not (isinstance(x, SymNodeVariable) or isinstance(y, SymNodeVariable)):
        return None
    values = []
    for v in (x, y):
        if isinstance(v, SymNodeVariable):
            if v.python_type() is not int:
                return None
            values.append(v.as_example())
        elif v.is_python_constant() and type(v.as_python_constant()) is int:
            values.append(v.as_python_constant())
        else:
            return None
    return values[0] == values[1]


def _guarded_truth(value: Any) -> bool:
    """A SymBool's value now, with the ShapeEnv guard that keeps it (a graph break when it
    depends on tensor data)."""
    try:
        return bool(value)
    except GuardOnDataDependentSymNode as e:
        raise Unsupported(f"data-dependent comparison of sizes ({value})") from e


# -- `is` and `in` -------------------------------------------------------------------------


def _same_input(tx, a, b) -> bool:
    """Whether two tensors that came from the frame are one object (guarded)."""
    from ...sources import IdentitySource

    src = IdentitySource(a.source, b.source)
    if not src.guardable:
        raise Unsupported("`is` between two input tensors that cannot be guarded")
    real = {node: value for node, _src, value in tx.output.graph_inputs}
    for tv in (a, b):
        if tv.node.op == "get_attr":
            real[tv.node] = tx.output.attr_tensors[tv.node.target]
    if a.node not in real or b.node not in real:
        raise Unsupported("`is` between two input tensors")
    same = real[a.node] is real[b.node]
    tx.output.guards.add(Guard(src, GuardKind.CONSTANT_MATCH, same, "identity"))
    return same


@upper.provide
def is_op(tx, a: VariableTracker, b: VariableTracker, *, negate: bool) -> VariableTracker:
    """``a is b`` (``is not`` with ``negate``), decided while tracing: two input tensors
    that may or may not be one object are compared now and the answer guarded."""
    from .tensor import TensorVariable

    def result(same: bool) -> VariableTracker:
        return ConstantVariable(same != negate)

    if a is b:
        return result(True)
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        if a.node is b.node:
            return result(True)
        from .tensor_select import is_selection, refuse_observed

        if is_selection(tx.output, a.node) or is_selection(tx.output, b.node):
            refuse_observed(tx.output, "`is` on it")
        if a.source is not None and b.source is not None:
            # two inputs may or may not be the same object: decide now, guard the answer
            return result(_same_input(tx, a, b))
        return result(False)
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return result(False)
    if (a.mutable and a.source is None) or (b.mutable and b.source is None):
        # an object made while tracing is only ever the same tracker
        return result(False)
    if a.is_python_constant() and b.is_python_constant():
        return result(a.as_python_constant() is b.as_python_constant())
    ia, ib = known_object(a), known_object(b)
    if ia is not None and ib is not None:
        return result(ia is ib)
    from .misc import NullVariable

    if isinstance(a, NullVariable) or isinstance(b, NullVariable):
        raise Unsupported("`is` on NULL")
    # different tracker kinds with known python types: different objects
    try:
        ta, tb = a.python_type(), b.python_type()
        if ta is not tb:
            return result(False)
    except Unsupported:
        pass
    raise Unsupported(f"`is` between {a.describe()} and {b.describe()}")


@upper.provide
def contains_op(tx, container: VariableTracker, item: VariableTracker) -> VariableTracker:
    """``item in container``: the container's own ``contains``, else decided on constants
    or on the identity of known objects."""
    from .containers import BaseSequenceVariable, ConstDictVariable, dict_key

    contains = getattr(container, "contains", None)
    if contains is not None:
        return contains(tx, item)

    if isinstance(container, ConstDictVariable):
        return ConstantVariable(dict_key(tx, item) in container.items)
    if container.is_python_constant() and item.is_python_constant():
        return ConstantVariable(item.as_python_constant() in container.as_python_constant())
    if isinstance(container, BaseSequenceVariable):
        if item.is_python_constant():
            target = item.as_python_constant()
            found = False
            for el in container.items:
                if el.is_python_constant() and el.as_python_constant() == target:
                    found = True
                    break
                if not el.is_python_constant():
                    raise Unsupported("`in` on a sequence with non-constant items")
            return ConstantVariable(found)
        ident = known_object(item)
        if ident is not None and all(known_object(el) is not None for el in container.items):
            return ConstantVariable(any(known_object(el) is ident for el in container.items))
    raise Unsupported(f"`in` between {item.describe()} and {container.describe()}")

