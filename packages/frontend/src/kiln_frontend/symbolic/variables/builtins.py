"""Builtins (``len``, ``isinstance``, ``getattr``, ``min``, ``zip``...) and ``operator``
functions called as values: ``BuiltinVariable``.

A call looks for a handler, registered with ``@builtin_handler(fn)`` in ``BUILTIN_CALLS``
(one per builtin, duplicates refused) or in ``stdlib.BUILTIN_HANDLERS``.  A handler returns
a tracker, or None when the call is not one it knows; the call is then an ``operator``
function (``operators.call_operator``), folded on constants (``FOLDABLE_BUILTINS``), or a
graph break saying ``call to builtin <name>``."""

from __future__ import annotations

import math
import operator
import types
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from .base import KnownCallableVariable, NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable, wrap_constant_result
from .functions import (
    NestedUserFunctionVariable,
    NoOpVariable,
    PartialVariable,
    SuperVariable,
    UserFunctionVariable,
)
from .handler_table import BUILTIN_CALLS, builtin_handler
from .operators import OPERATOR_FUNCTIONS, call_operator, constant_args, has_tensor, known_object

#: builtins run on constant arguments while tracing (their result is a constant)
FOLDABLE_BUILTINS = frozenset({
    abs, all, any, bin, bool, bytes, callable, chr, complex, divmod, float, format, hash,
    hex, int, oct,
    len, max, min, ord, pow, repr, round, sorted, str, sum, slice, range, tuple, list, dict,
    set, frozenset,
    math.sqrt, math.ceil, math.floor, math.prod, math.log, math.exp, math.isclose,
})

#: builtins that are classes (tuple, list, range...) are wrapped as BuiltinVariable too
BUILTIN_CLASSES = frozenset({
    int, float, bool, str, tuple, list, dict, set, frozenset, slice, range, enumerate, zip,
    reversed, type, bytes, complex, object, super, map, filter,
})
upper.provide(BUILTIN_CLASSES, name="BUILTIN_CLASSES")


#: builtins that keep a dynamic int/float symbolic (a graph node) instead of specializing
#: it, as torch.compile does: the builtin -> the callable of the node
SYMBOLIC_BUILTINS: dict[Any, Any] = {abs: abs, int: torch.sym_int, float: torch.sym_float,
                                     round: round}


def _symbolic_builtin(tx, fn, args, kwargs) -> VariableTracker | None:
    """``abs(n)``, ``int(s)``, ``round(s, 1)`` on a SymNodeVariable (others constants)."""
    target = SYMBOLIC_BUILTINS.get(fn)
    if target is None or kwargs or not args:
        return None
    from ...shapes import SymNodeVariable, wrap_symbolic

    first = tx.realize(args[0])
    if not isinstance(first, SymNodeVariable) or \
            not all(a.is_python_constant() for a in args[1:]):
        return None
    rest = [a.as_python_constant() for a in args[1:]]
    try:
        value = target(first.as_example(), *rest)
    except Exception:  # noqa: BLE001 - not symbolic there: the usual path specializes
        return None
    return wrap_symbolic(tx.output, lambda: tx.output.tracer.create_proxy(
        "call_function", target, (first.as_proxy(), *rest), {}), value)


def is_builtin_callable(value: Any) -> bool:
    from .stdlib import BUILTIN_HANDLERS as stdlib_handlers

    return (value in BUILTIN_CALLS or value in FOLDABLE_BUILTINS or
            value in stdlib_handlers or
            value in OPERATOR_FUNCTIONS or value in BUILTIN_CLASSES or
            getattr(value, "__module__", None) in ("builtins", "_operator", "operator"))


@upper.provide
@tracker_for(types.BuiltinFunctionType)
class BuiltinVariable(KnownCallableVariable):
    """``len``, ``isinstance``, ``range``, ``operator.add``...: folded on constants, turned
    into graph nodes on tensors where that means something, a graph break otherwise."""

    @classmethod
    def wrap(cls, builder, value):
        from .torch import TorchFunctionVariable, is_torch_callable

        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(builder, value)
        if builder.source is not None:  # a global, a module's or an object's attribute
            builder.install_identity_guard(value, what="builtin")
        return cls(value, source=builder.source)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        from .misc import ObjectSetattrVariable

        if self.fn is object and name == "__setattr__":
            return ObjectSetattrVariable()
        if self.fn is object and name == "__init__":
            return NoOpVariable("object.__init__")
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise Unsupported(f"builtin {self.name} has no attribute {name!r}") from None
        from .constant import is_constant_value

        if is_constant_value(value):
            return ConstantVariable.create(value)
        if isinstance(value, types.BuiltinFunctionType) and is_builtin_callable(value):
            return BuiltinVariable(value)
        raise Unsupported(f"attribute {name!r} of builtin {self.name}")

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        handler = BUILTIN_CALLS.get(fn)
        if handler is None:
            from .stdlib import BUILTIN_HANDLERS as stdlib_handlers

            handler = stdlib_handlers.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in OPERATOR_FUNCTIONS:
            return call_operator(tx, fn, args, kwargs)
        symbolic = _symbolic_builtin(tx, fn, args, kwargs)
        if symbolic is not None:
            return symbolic
        if fn in FOLDABLE_BUILTINS:
            cargs, ckwargs = constant_args(args, kwargs, f"builtin {self.name}")
            try:
                result = fn(*cargs, **ckwargs)
            except Exception as e:  # noqa: BLE001
                from .raising import raise_traced_from

                raise_traced_from(e, f"builtin {self.name}")
            return wrap_constant_result(result, what=f"builtin {self.name}")
        raise Unsupported(f"call to builtin {self.name}")


# -- handlers, one per builtin ----------------------------------------------------------


@builtin_handler(len)
def _b_len(tx, args, kwargs):
    from .containers import BaseSequenceVariable, ConstDictVariable
    from .tensor import TensorVariable

    if len(args) != 1 or kwargs:
        return None
    (x,) = args
    if isinstance(x, TensorVariable):
        if x.example_value.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return ConstantVariable(int(x.example_value.shape[0]))
    if isinstance(x, (BaseSequenceVariable, ConstDictVariable)):
        return ConstantVariable(len(x.items))
    if hasattr(x, "module") and hasattr(x.module, "__len__"):
        if hasattr(x, "guard_structure"):  # a module container: its length is guarded
            x.guard_structure(tx)
        return ConstantVariable(len(x.module))
    if hasattr(x, "len_value"):
        return ConstantVariable(x.len_value(tx))
    return None


@builtin_handler(str)
def _b_str(tx, args, kwargs):
    """``str(obj)`` of a tracker that knows its text (``str_value()``: an exception made
    while tracing); constants fold as before."""
    if len(args) != 1 or kwargs:
        return None
    x = tx.realize(args[0])
    if hasattr(x, "str_value"):
        return ConstantVariable(x.str_value())
    return _python_text_dunder(tx, x, ("__str__", "__repr__"))


@builtin_handler(repr)
def _b_repr(tx, args, kwargs):
    """``repr(obj)``: an exception made while tracing knows its text; a user class's
    Python ``__repr__`` is inlined; constants fold as before."""
    if len(args) != 1 or kwargs:
        return None
    x = tx.realize(args[0])
    if hasattr(x, "repr_value"):
        return ConstantVariable(x.repr_value())
    return _python_text_dunder(tx, x, ("__repr__",))


def _python_text_dunder(tx, x: VariableTracker, names: tuple[str, ...]):
    """The first of ``names`` the user object's class defines in Python, inlined
    (``object.__str__`` calls ``__repr__``); None for other trackers."""
    from .misc import PythonProtocolMixin, python_dunder

    if not isinstance(x, PythonProtocolMixin) or hasattr(x, "str_value"):
        return None
    for name in names:
        if python_dunder(x.python_type(), name) is not None:
            return x._call_dunder(tx, name, [])
        if getattr(x.python_type(), name) is not getattr(object, name):
            return None  # a C method of a base class: not ours to guess
    return None


def _python_type_of(tx, v: VariableTracker) -> type:
    return v.python_type()


@builtin_handler(isinstance)
def _b_isinstance(tx, args, kwargs):
    if len(args) != 2 or kwargs:
        return None
    obj, cls_var = args
    try:
        cls = cls_var.as_python_constant()
    except NotConstant:
        raise Unsupported("isinstance() with a non-constant class") from None
    typ = _python_type_of(tx, obj)
    try:
        return ConstantVariable(issubclass(typ, cls))
    except TypeError as e:
        raise Unsupported(f"isinstance(): {e}") from e


@builtin_handler(issubclass)
def _b_issubclass(tx, args, kwargs):
    cargs, ckwargs = constant_args(args, kwargs, "issubclass")
    return ConstantVariable(issubclass(*cargs, **ckwargs))


@builtin_handler(type)
def _b_type(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    typ = args[0].python_type()
    from .misc import wrap_class

    return wrap_class(typ)


@builtin_handler(iter)
def _b_iter(tx, args, kwargs):
    if len(args) == 2 and not kwargs:
        from .itertools_vars import callable_iterator

        return callable_iterator(tx, *args)
    if len(args) != 1 or kwargs:
        return None
    if isinstance(args[0], ConstantVariable) and \
            type(args[0].value) in (int, float, bool, complex, type(None)):
        # eager's TypeError, catchable by the frame (pytest's rewritten ``assert`` asks
        # whether an operand is iterable with ``try: iter(obj) except Exception``)
        from .raising import raise_traced

        raise_traced(TypeError, f"{type(args[0].value).__name__!r} object is not iterable")
    return args[0].iter_var(tx)


@builtin_handler(next)
def _b_next(tx, args, kwargs):
    from .containers import IteratorVariable
    from .raising import raise_traced

    if not args or len(args) > 2 or kwargs or not isinstance(args[0], IteratorVariable):
        return None
    from .iterators import GeneratorVariable, finishing_value, stop_iteration

    was_finished = getattr(args[0], "finished", False)
    item = args[0].next_item(tx)
    if item is None:
        if len(args) == 2:
            return args[1]
        if isinstance(args[0], GeneratorVariable):  # ``e.value``: what its body returned
            raise stop_iteration(finishing_value(args[0], was_finished))
        raise_traced(StopIteration)  # caught by a traced `except StopIteration`, else a break
    return item


@builtin_handler(enumerate)
def _b_enumerate(tx, args, kwargs):
    from .iterators import EnumerateVariable

    if not args or len(args) > 2 or set(kwargs) - {"start"}:
        return None
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    try:
        s = start.as_python_constant()
    except NotConstant:
        raise Unsupported("enumerate() with a non-constant start") from None
    return EnumerateVariable(args[0].iter_var(tx), s)


@builtin_handler(zip)
def _b_zip(tx, args, kwargs):
    from .iterators import ZipVariable

    if set(kwargs) - {"strict"}:
        return None
    try:
        strict = bool(kwargs["strict"].as_python_constant()) if kwargs else False
    except NotConstant:
        raise Unsupported("zip() with a non-constant strict") from None
    return ZipVariable([a.iter_var(tx) for a in args], strict)


@builtin_handler(reversed)
def _b_reversed(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if len(args) != 1 or kwargs:
        return None
    return ListIteratorVariable(list(reversed(tx.unpack_sequence(args[0]))))


def _b_tuple_list(kind):
    def handler(tx, args, kwargs):
        from .containers import ListVariable, TupleVariable

        if kwargs or len(args) > 1:
            return None
        items = tx.unpack_sequence(args[0]) if args else []
        return TupleVariable(items) if kind is tuple else ListVariable(items)

    return handler


for _cls in (tuple, list):
    BUILTIN_CALLS.add(_cls, _b_tuple_list(_cls))


@builtin_handler(tuple.__new__)
def _b_tuple_new(tx, args, kwargs):
    """``tuple.__new__(cls, iterable)`` for a namedtuple class (``cls._make``): a tuple of
    that class holding the items; any other class is not known here (None)."""
    from .containers import TupleVariable
    from .misc import UserDefinedClassVariable

    if kwargs or len(args) != 2:
        return None
    cls_var = tx.realize(args[0])
    cls = getattr(cls_var, "cls", None)
    if not isinstance(cls_var, UserDefinedClassVariable) or not (
            isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return None
    return TupleVariable(tx.unpack_sequence(args[1]), tuple_cls=cls)


@builtin_handler(dict)
def _b_dict(tx, args, kwargs):
    from .containers import ConstDictVariable, dict_key

    items: dict[Any, VariableTracker] = {}
    if len(args) > 1:
        return None
    if args:
        src = args[0]
        if isinstance(src, ConstDictVariable):
            items.update(src.items)
        else:
            for pair in tx.unpack_sequence(src):
                k, v = tx.unpack_sequence(pair)
                items[dict_key(tx, k)] = v
    items.update(kwargs)
    return ConstDictVariable(items)


def _attribute_name(v: VariableTracker, builtin: str) -> str:
    """The name argument of getattr/hasattr/setattr, which must be known while tracing."""
    try:
        return v.as_python_constant()
    except NotConstant:
        raise Unsupported(f"{builtin}() with a non-constant name") from None


@builtin_handler(getattr)
def _b_getattr(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    name = _attribute_name(args[1], "getattr")
    if len(args) == 3:
        has = _b_hasattr(tx, args[:2], {})
        if has is not None and not has.as_python_constant():
            return args[2]
        from .raising import TracedException

        try:
            return tx.getattr(args[0], name)
        except TracedException as e:
            if issubclass(e.exc.cls, AttributeError):
                return args[2]
            raise
        except Unsupported as e:
            if "has no attribute" in str(e):
                return args[2]
            raise
    return tx.getattr(args[0], name)


def _real_input(tx, var) -> Any:
    """The real tensor behind graph input ``var`` (None for one made in the frame)."""
    if var.source is None:
        return None
    return next((real for node, _src, real in tx.output.graph_inputs
                 if node is var.proxy.node), None)


@builtin_handler(hasattr)
def _b_hasattr(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    name = _attribute_name(args[1], "hasattr")
    if isinstance(args[0], ConstantVariable):  # None, numbers, strings: already guarded
        return ConstantVariable(hasattr(args[0].value, name))
    from .attributes import hasattr_after_frame_store

    stored = hasattr_after_frame_store(tx, args[0], name)  # the frame set or deleted it
    if stored is not None:
        return ConstantVariable(stored)
    obj = known_object(args[0])
    from .tensor import TensorVariable

    if obj is not None and not isinstance(obj, torch.Tensor):
        result = hasattr(obj, name)
    elif isinstance(args[0], TensorVariable):
        real = _real_input(tx, args[0]) if not hasattr(torch.Tensor, name) else None
        if real is None:
            return ConstantVariable(hasattr(args[0].example_value, name))
        # a Python attribute of an input tensor (``x.tag = ...``): the fake has none, the
        # real one tells, guarded (it was always False here, so getattr(x, "tag", None)
        # gave None for a tagged tensor)
        result = hasattr(real, name)
    elif getattr(args[0], "has_attr", None) is not None:
        result = args[0].has_attr(tx, name)
    else:
        return None
    if args[0].source is not None:  # an attribute added or deleted later recompiles
        from ...guards import Guard

        tx.output.guards.add(Guard(args[0].source, GuardKind.HASATTR, (name, bool(result))))
    return ConstantVariable(result)


@builtin_handler(sum)
def _b_sum(tx, args, kwargs):
    if set(kwargs) - {"start"} or not args or len(args) + len(kwargs) > 2:
        return None
    from .containers import iterate

    acc = args[1] if len(args) == 2 else kwargs.get("start", ConstantVariable(0))
    for it in iterate(tx, args[0]):  # item by item, as eager adds them
        acc = call_operator(tx, operator.add, [acc, tx.realize(it)], {})
    return acc


def _b_minmax(fn):
    def handler(tx, args, kwargs):
        if set(kwargs) - {"key", "default"} or ("default" in kwargs and len(args) != 1):
            return None
        items = tx.unpack_sequence(args[0]) if len(args) == 1 else list(args)
        items = [tx.realize(it) for it in items]
        if not items and "default" in kwargs:
            return kwargs["default"]
        key = kwargs.get("key")
        if items and key is not None and not (key.is_python_constant() and
                                    key.as_python_constant() is None):
            # the key function is traced per item (as eager calls it); the winner is
            # chosen on the keys' values, first one on ties as in eager
            keys = [tx.realize(tx.call_function(key, [it], {})) for it in items]
            try:
                kvals = [k.as_python_constant() for k in keys]
            except NotConstant:
                raise Unsupported(f"{fn.__name__}(key=...) whose keys are not "
                                  "constants") from None
            return items[fn(range(len(items)), key=kvals.__getitem__)]
        if len(items) == 2 and not has_tensor(items) and any(
                type(it).__name__ == "SymNodeVariable" for it in items):
            # max(n, 3) on a dynamic int stays symbolic: torch.sym_max in the graph
            from .builder import VariableBuilder

            sym = torch.sym_max if fn is max else torch.sym_min
            return tx.call_function(VariableBuilder(tx, None, guard=False)(sym), items, {})
        if has_tensor(items):
            from .tensor_select import select_extreme

            return select_extreme(tx, fn, items)
        try:
            values = [it.as_python_constant() for it in items]
        except NotConstant:
            raise Unsupported(f"{fn.__name__}() over non-constants") from None
        try:
            result = fn(values)
        except (ValueError, TypeError) as e:
            from .raising import raise_traced_from

            raise_traced_from(e, f"{fn.__name__}()")
        return wrap_constant_result(result, what=fn.__name__)

    return handler


for _fn in (min, max):
    BUILTIN_CALLS.add(_fn, _b_minmax(_fn))


@builtin_handler(abs)
def _b_abs(tx, args, kwargs):
    if len(args) == 1 and has_tensor(args):
        return tx.output.create_graph_op("call_function", operator.abs, list(args), {})
    return None


def _b_scalar_cast(fn):
    def handler(tx, args, kwargs):
        if has_tensor(args):
            if fn in (int, float) and len(args) == 1 and not kwargs:
                # t.item() in the graph: an unbacked symbol (tensor.SCALAR_METHODS)
                return args[0].call_method(tx, f"__{fn.__name__}__", [], {})
            raise Unsupported(f"{fn.__name__}() of a tensor (data-dependent)")
        if fn is bool and len(args) == 1 and not kwargs and not args[0].is_python_constant():
            # the truth protocol (__bool__, __len__, a container's length), as `if v:` uses
            return ConstantVariable(tx.realize(args[0]).truth_value(tx))
        return None

    return handler


for _cls in (int, float, bool):
    BUILTIN_CALLS.add(_cls, _b_scalar_cast(_cls))


@builtin_handler(callable)
def _b_callable(tx, args, kwargs):
    if len(args) != 1:
        return None
    v = args[0]
    obj = known_object(v)
    if obj is not None:
        return ConstantVariable(callable(obj))
    if isinstance(v, (UserFunctionVariable, NestedUserFunctionVariable, PartialVariable,
                      BuiltinVariable, NoOpVariable)):
        return ConstantVariable(True)
    try:
        cls = v.python_type()
    except Unsupported:
        return None
    return ConstantVariable(any("__call__" in k.__dict__ for k in cls.__mro__))


@builtin_handler(super)
def _b_super(tx, args, kwargs):
    if kwargs:
        return None
    if len(args) == 2:
        try:
            cls = args[0].as_python_constant()
        except NotConstant:
            raise Unsupported("super() with a non-constant class") from None
        return SuperVariable(cls, args[1])
    if args:
        return None
    code = tx.code
    if "__class__" not in code.co_freevars or code.co_argcount == 0:
        raise Unsupported("super() outside a method")
    cls = tx.realize(tx.load_deref("__class__"))
    first = code.co_varnames[0]
    if first not in tx.symbolic_locals:
        raise Unsupported("super(): the first argument was deleted")
    obj = tx.realize(tx.symbolic_locals[first])
    tx.symbolic_locals[first] = obj
    return SuperVariable(cls.as_python_constant(), obj)


@builtin_handler(setattr)
def _b_setattr(tx, args, kwargs):
    if kwargs or len(args) != 3:
        return None
    name = _attribute_name(args[1], "setattr")
    store = getattr(args[0], "store_attr", None)
    if store is None:  # an object from the frame: replayed after the graph
        tx.output.side_effects.store_attr(tx, args[0], name, args[2])
        return ConstantVariable(None)
    store(tx, name, args[2])
    return ConstantVariable(None)


@builtin_handler(delattr)
def _b_delattr(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    name = _attribute_name(args[1], "delattr")
    tx.output.side_effects.delete_attr(tx, tx.realize(args[0]), name)
    return ConstantVariable(None)


@upper.provide(name="traced_sorted")
@builtin_handler(sorted)
def _b_sorted(tx, args, kwargs):
    if len(args) != 1:
        return None
    items = tx.unpack_sequence(args[0])
    key = kwargs.get("key")
    reverse = kwargs.get("reverse", ConstantVariable(False))
    if set(kwargs) - {"key", "reverse"}:
        return None
    try:
        rev = reverse.as_python_constant()
        if key is None or (key.is_python_constant() and key.as_python_constant() is None):
            values = [it.as_python_constant() for it in items]
            return ConstantVariable.create(sorted(values, reverse=rev))
    except NotConstant:
        pass
    if key is None:
        raise Unsupported("sorted() of non-constant items")
    # sort trackers by a key computed while tracing (must give constants)
    keyed = []
    for it in items:
        k = tx.call_function(key, [it], {})
        try:
            keyed.append((k.as_python_constant(), it))
        except NotConstant:
            raise Unsupported("sorted() with a key that is not a constant") from None
    from .containers import ListVariable

    order = sorted(range(len(keyed)), key=lambda i: keyed[i][0], reverse=rev)
    return ListVariable([keyed[i][1] for i in order])


@builtin_handler(map)
def _b_map(tx, args, kwargs):
    from .iterators import MapVariable

    if kwargs or len(args) < 2:
        return None
    return MapVariable([args[0], *(a.iter_var(tx) for a in args[1:])])


@builtin_handler(filter)
def _b_filter(tx, args, kwargs):
    from .iterators import FilterVariable

    if kwargs or len(args) != 2:
        return None
    return FilterVariable([args[0], args[1].iter_var(tx)])


def _is_none_var(v) -> bool:
    return v.is_python_constant() and v.as_python_constant() is None


def _b_any_all(fn):
    def handler(tx, args, kwargs):
        if kwargs or len(args) != 1:
            return None
        from .containers import iterate

        for v in iterate(tx, args[0]):  # item by item: eager stops at the deciding one
            if tx.realize(v).truth_value(tx) is (fn is any):
                return ConstantVariable(fn is any)
        return ConstantVariable(fn is all)

    return handler


for _fn in (any, all):
    BUILTIN_CALLS.add(_fn, _b_any_all(_fn))


@builtin_handler(hash)
def _b_hash(tx, args, kwargs):
    """``hash(obj)`` of an object whose class defines ``__hash__`` in Python (a frozen
    dataclass's): that function inlined on it, as the type slot calls it (an instance
    attribute is not looked at), its int kept when it fits a Py_hash_t and hashed again
    otherwise, -1 made -2, as CPython's ``slot_tp_hash`` does.  Constants fold as before."""
    import inspect

    if len(args) != 1 or kwargs:
        return None
    obj = tx.realize(args[0])
    if obj.is_python_constant():
        return None
    try:
        cls = obj.python_type()
    except (Unsupported, NotImplementedError):
        return None
    slot = inspect.getattr_static(cls, "__hash__", None)
    if not isinstance(slot, types.FunctionType):
        return None
    result = upper.method_of_pinned_class(tx, cls, "__hash__", slot, obj).call_function(
        tx, [], {})
    try:
        value = result.as_python_constant()
    except NotConstant:
        raise Unsupported(f"{cls.__qualname__}.__hash__ returned {result.describe()}") from None
    if not isinstance(value, int):  # (eager: TypeError)
        raise Unsupported(f"{cls.__qualname__}.__hash__ returned a {type(value).__name__}")
    h = int(value) if -(2 ** 63) <= value < 2 ** 63 else hash(int(value))
    return ConstantVariable(-2 if h == -1 else h)


@builtin_handler(id)
def _b_id(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    from .tensor import TensorVariable

    if isinstance(args[0], TensorVariable):
        from .tensor_select import is_selection, refuse_observed

        if is_selection(tx.output, args[0].node):
            refuse_observed(tx.output, "id() of it")
    if args[0].mutable and args[0].source is None or isinstance(args[0], TensorVariable):
        # (a tensor's id: compared by ``is``, which guards two inputs' identity)
        return ObjectIdVariable(args[0])
    obj = known_object(args[0])
    if obj is None or args[0].mutable:
        raise Unsupported(f"id() of {args[0].describe()}")
    if args[0].source is not None:  # the id is baked: the object must be the same one
        from ...guards import Guard

        tx.output.guards.add(Guard(args[0].source, GuardKind.ID_MATCH, id(obj), "object"))
    return ConstantVariable(id(obj))


@upper.provide
class ObjectIdVariable(VariableTracker):
    """``id(obj)`` of an object made while tracing: its number is not known before the
    frame runs, so it is only compared (``==``/``!=``: the same tracker, the same object,
    as ``is`` decides) and never becomes a value of the frame (stored or returned: a graph
    break, rather than one baked number for the objects of every call)."""

    def __init__(self, obj: VariableTracker):
        super().__init__()
        self.obj = obj

    def python_type(self) -> type:
        return int

    def children(self):
        return [self.obj]

    def reconstruct(self, codegen) -> None:
        raise Unsupported(f"id() of {self.obj.describe()} outlives the frame")

    def describe(self) -> str:
        return f"id({self.obj.describe()})"
