"""User functions (inlined), methods, functions made while tracing, and builtins."""

from __future__ import annotations

import inspect
import math
import operator
import types
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import GuardKind
from ...sources import GlobalSource
from .base import NotConstant, VariableTracker, tracker_for
from .constant import (
    BINARY_OPERATORS,
    COMPARE_OPERATORS,
    ConstantVariable,
    wrap_constant_result,
)

_GEN_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def is_torch_internal_file(filename: str) -> bool:
    import os

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    return filename.startswith(torch_dir)


def check_inlinable(fn: types.FunctionType) -> None:
    """Python code inside torch (context managers, hooks, utilities) is not inlined: a call
    to it is a graph break in the user's frame.  torch functions that belong in graphs are
    TorchFunctionVariable, and torch's own modules become call_module nodes."""
    if is_torch_internal_file(fn.__code__.co_filename):
        raise Unsupported(f"call to {fn.__module__}.{fn.__qualname__} (torch internals are "
                          "not inlined)")


@tracker_for(types.FunctionType)
class UserFunctionVariable(VariableTracker):
    """A Python function from the user's code: calling it inlines its bytecode."""

    def __init__(self, fn: types.FunctionType, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    @classmethod
    def wrap(cls, builder, value):
        from .torch import TorchFunctionVariable, is_torch_callable

        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(builder, value)
        builder.install_guard(GuardKind.FUNCTION_MATCH, id(value), what="function")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return types.FunctionType

    # inlining interface
    def get_code(self) -> types.CodeType:
        return self.fn.__code__

    def get_globals(self) -> dict:
        return self.fn.__globals__

    def get_name(self) -> str:
        return self.fn.__qualname__

    def get_defaults(self, tx) -> tuple[list[VariableTracker], dict[str, VariableTracker]]:
        from ...sources import defaults_source, kwdefaults_source

        defaults = []
        for i, d in enumerate(self.fn.__defaults__ or ()):
            src = defaults_source(self.source, i) if self.source is not None else None
            defaults.append(tx.wrap_value(d, src))
        kwdefaults = {}
        for k, d in (self.fn.__kwdefaults__ or {}).items():
            src = kwdefaults_source(self.source, k) if self.source is not None else None
            kwdefaults[k] = tx.wrap_value(d, src)
        return defaults, kwdefaults

    def get_closure_cells(self, tx) -> dict[str, Any]:
        from ...sources import cell_contents_source
        from .misc import ClosureCellVariable

        cells: dict[str, Any] = {}
        code = self.fn.__code__
        for i, name in enumerate(code.co_freevars):
            cell = self.fn.__closure__[i]
            src = cell_contents_source(self.source, i) if self.source is not None else None
            cells[name] = ClosureCellVariable(cell, src)
        return cells

    def call_function(self, tx, args, kwargs):
        if self.fn.__code__.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling generator/coroutine function {self.fn.__qualname__}")
        check_inlinable(self.fn)
        return tx.inline_call(self, args, kwargs)

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen.load_const_object(self.fn)

    def describe(self) -> str:
        return f"UserFunctionVariable({self.fn.__qualname__})"


class UserMethodVariable(UserFunctionVariable):
    """A function bound to an object tracker (``self.helper`` on a module or object)."""

    def __init__(self, fn: types.FunctionType, obj: VariableTracker, *, source=None):
        super().__init__(fn, source=source)
        self.obj = obj

    def children(self):
        return [self.obj]

    def call_function(self, tx, args, kwargs):
        if self.fn.__code__.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling generator/coroutine method {self.fn.__qualname__}")
        check_inlinable(self.fn)
        return tx.inline_call(self, [self.obj, *args], kwargs)

    def get_defaults(self, tx):
        # defaults are reached through the class, not through the bound method
        defaults = [tx.wrap_value(d, None) for d in (self.fn.__defaults__ or ())]
        kwdefaults = {k: tx.wrap_value(d, None)
                      for k, d in (self.fn.__kwdefaults__ or {}).items()}
        return defaults, kwdefaults

    def get_closure_cells(self, tx):
        from .misc import ClosureCellVariable

        code = self.fn.__code__
        return {name: ClosureCellVariable(self.fn.__closure__[i], None)
                for i, name in enumerate(code.co_freevars)}

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen(self.obj)
        codegen.load_attr(self.fn.__name__)

    def describe(self) -> str:
        return f"UserMethodVariable({self.fn.__qualname__})"


class NestedUserFunctionVariable(VariableTracker):
    """A function created by MAKE_FUNCTION while tracing (comprehensions on 3.11, lambdas,
    inner functions).  Its closure cells point at the creating translator's locals."""

    def __init__(self, code: types.CodeType, f_globals: dict, qualname: str,
                 defaults: list[VariableTracker], kwdefaults: dict[str, VariableTracker],
                 closure: list[VariableTracker]):
        super().__init__()
        self.code = code
        self.f_globals = f_globals
        self.qualname = qualname
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure

    def get_code(self):
        return self.code

    def get_globals(self):
        return self.f_globals

    def get_name(self):
        return self.qualname

    def get_defaults(self, tx):
        return list(self.defaults), dict(self.kwdefaults)

    def get_closure_cells(self, tx):
        return dict(zip(self.code.co_freevars, self.closure, strict=True))

    def call_function(self, tx, args, kwargs):
        if self.code.co_flags & _GEN_FLAGS:
            raise Unsupported(f"calling generator/coroutine function {self.qualname}")
        return tx.inline_call(self, args, kwargs)

    def reconstruct(self, codegen):
        # MAKE_FUNCTION again, with the same cells (LOAD_CLOSURE of the frame's own cell
        # and free variables)
        from .misc import LocalCellVariable

        if self.defaults or self.kwdefaults:
            raise Unsupported(f"cannot rebuild function {self.qualname} with defaults")
        names = []
        for cell in self.closure:
            name = getattr(cell, "name", None)
            owner = getattr(cell, "tx", None)
            if isinstance(cell, LocalCellVariable) and owner is not None and owner.parent is None:
                names.append(name)
            elif type(cell).__name__ == "RootFreeVarCell":
                names.append(name)
            else:
                raise Unsupported(f"cannot rebuild function {self.qualname}: its closure "
                                  "is not the frame's")
        if names and not all(n in codegen.cellvars or n in codegen.freevars for n in names):
            raise Unsupported(f"cannot rebuild function {self.qualname}")
        codegen.make_function(self.code, names)

    def describe(self) -> str:
        return f"NestedUserFunctionVariable({self.qualname})"


def bind_args(code: types.CodeType, name: str, args: list[VariableTracker],
              kwargs: dict[str, VariableTracker], defaults: list[VariableTracker],
              kwdefaults: dict[str, VariableTracker]) -> dict[str, VariableTracker]:
    """Python's argument binding, on trackers: returns local name -> tracker."""
    from .containers import ConstDictVariable, TupleVariable

    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    varnames = code.co_varnames
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    pos_names = varnames[:nargs]
    kwonly_names = varnames[nargs:nargs + nkwonly]
    bound: dict[str, VariableTracker] = {}

    if len(args) > nargs and not has_varargs:
        raise Unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} given")
    for pname, a in zip(pos_names, args, strict=False):
        bound[pname] = a
    extra = list(args[nargs:])
    kw_rest: dict[str, VariableTracker] = {}
    for k, v in kwargs.items():
        if k in pos_names[nposonly:] or k in kwonly_names:
            if k in bound:
                raise Unsupported(f"{name}() got multiple values for argument {k!r}")
            bound[k] = v
        elif has_varkw:
            kw_rest[k] = v
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {k!r}")
    # defaults for the last len(defaults) positional parameters
    first_default = nargs - len(defaults)
    for i, pname in enumerate(pos_names):
        if pname not in bound:
            if i >= first_default:
                bound[pname] = defaults[i - first_default]
            else:
                raise Unsupported(f"{name}() missing argument {pname!r}")
    for k in kwonly_names:
        if k not in bound:
            if k in kwdefaults:
                bound[k] = kwdefaults[k]
            else:
                raise Unsupported(f"{name}() missing keyword-only argument {k!r}")
    idx = nargs + nkwonly
    if has_varargs:
        bound[varnames[idx]] = TupleVariable(extra)
        idx += 1
    if has_varkw:
        bound[varnames[idx]] = ConstDictVariable(kw_rest)
    return bound


# --------------------------------------------------------------------------------------
# Builtins and operator functions
# --------------------------------------------------------------------------------------


def _const_args(args, kwargs, what: str):
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except NotConstant:
        raise Unsupported(f"{what} with non-constant arguments") from None


_FOLDABLE_BUILTINS = frozenset({
    abs, all, any, bool, bytes, callable, chr, complex, divmod, float, format, hash, int,
    len, max, min, ord, pow, repr, round, sorted, str, sum, slice, range, tuple, list,
    math.sqrt, math.ceil, math.floor, math.prod, math.log, math.exp, math.isclose,
})

_OPERATOR_FNS = frozenset(
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


@tracker_for(types.BuiltinFunctionType)
class BuiltinVariable(VariableTracker):
    """``len``, ``isinstance``, ``range``, ``operator.add``...: folded on constants, turned
    into graph nodes on tensors where that means something, a graph break otherwise."""

    def __init__(self, fn: Any, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    @classmethod
    def wrap(cls, builder, value):
        from .torch import TorchFunctionVariable, is_torch_callable

        if is_torch_callable(value):
            return TorchFunctionVariable.wrap(builder, value)
        if isinstance(builder.source, GlobalSource):
            builder.install_guard(GuardKind.FUNCTION_MATCH, id(value), what="builtin")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def describe(self) -> str:
        return f"BuiltinVariable({self.name})"

    def reconstruct(self, codegen):
        if self.source is not None:
            return self.source.reconstruct(codegen)
        codegen.load_const_object(self.fn)

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            result = handler(tx, args, kwargs)
            if result is not None:
                return result
        if fn in _OPERATOR_FNS:
            return call_operator(tx, fn, args, kwargs)
        if fn in _FOLDABLE_BUILTINS or (isinstance(fn, type) and fn.__module__ == "builtins"
                                        and fn in (int, float, bool, str, tuple, list, dict,
                                                   set, frozenset, slice, range)):
            cargs, ckwargs = _const_args(args, kwargs, f"builtin {self.name}")
            try:
                result = fn(*cargs, **ckwargs)
            except Exception as e:  # noqa: BLE001
                raise Unsupported(f"builtin {self.name} raised {type(e).__name__}: {e}") from e
            return wrap_constant_result(result, what=f"builtin {self.name}")
        raise Unsupported(f"call to builtin {self.name}")


def _has_tensor(args) -> bool:
    from .tensor import TensorVariable

    return any(isinstance(a, TensorVariable) for a in args)


def call_operator(tx, fn, args, kwargs) -> VariableTracker:
    """``operator.<fn>(*args)`` on trackers (also what BINARY_OP / COMPARE_OP use)."""
    from .containers import BaseSequenceVariable, ConstDictVariable, ListVariable, TupleVariable

    if kwargs:
        raise Unsupported(f"operator.{fn.__name__} with keyword arguments")
    name = getattr(fn, "__name__", repr(fn))
    if fn in (operator.is_, operator.is_not):
        return is_op(tx, args[0], args[1], negate=fn is operator.is_not)
    if fn is operator.contains:
        return contains_op(tx, args[1], args[0])
    if fn is operator.getitem:
        return tx.getitem(args[0], args[1])
    if fn in (operator.not_, operator.truth):
        truth = args[0].truth_value(tx)
        return ConstantVariable(not truth if fn is operator.not_ else truth)
    if _has_tensor(args):
        if fn not in _TENSOR_OPERATORS:
            raise Unsupported(f"operator.{name} on a tensor")
        return tx.output.create_graph_op("call_function", fn, list(args), {})
    # sequences
    if len(args) == 2:
        a, b = args
        if isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable) and \
                fn in (operator.add, operator.iadd) and a.python_cls is b.python_cls:
            if fn is operator.iadd and isinstance(a, ListVariable):
                a.check_mutable("list +=")
                a.items.extend(b.items)
                return a
            return type(a)(a.items + b.items) if isinstance(a, ListVariable) else \
                TupleVariable(a.items + b.items)
        if fn in (operator.mul, operator.imul) and (
                isinstance(a, BaseSequenceVariable) or isinstance(b, BaseSequenceVariable)):
            seq, n = (a, b) if isinstance(a, BaseSequenceVariable) else (b, a)
            try:
                times = n.as_python_constant()
            except NotConstant:
                raise Unsupported("repeating a sequence a non-constant number of times") from None
            items = seq.items * times
            return ListVariable(items) if isinstance(seq, ListVariable) else TupleVariable(items)
        if fn in (operator.eq, operator.ne) and not (a.is_python_constant()
                                                     and b.is_python_constant()):
            if isinstance(a, (BaseSequenceVariable, ConstDictVariable)) or isinstance(
                    b, (BaseSequenceVariable, ConstDictVariable)):
                raise Unsupported("comparing containers with non-constant items")
            ia = _identity(a)
            ib = _identity(b)
            if ia is not None and ib is not None:
                same = ia is ib
                return ConstantVariable(same if fn is operator.eq else not same)
    cargs, _ = _const_args(args, {}, f"operator.{name}")
    try:
        result = fn(*cargs)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"operator.{name} raised {type(e).__name__}: {e}") from e
    return wrap_constant_result(result, what=f"operator.{name}")


def _identity(v: VariableTracker) -> Any:
    """The real object behind a tracker when it is known (modules, functions, constants)."""
    for attr in ("module", "value", "fn"):
        obj = getattr(v, attr, None)
        if obj is not None:
            return obj
    return None


def is_op(tx, a: VariableTracker, b: VariableTracker, *, negate: bool) -> VariableTracker:
    from .tensor import TensorVariable

    def result(same: bool) -> VariableTracker:
        return ConstantVariable(same != negate)

    if a is b:
        return result(True)
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        if a.node is b.node:
            return result(True)
        if a.source is not None and b.source is not None:
            # two inputs could be the same object at run time; not guarded
            raise Unsupported("`is` between two input tensors")
        return result(False)
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return result(False)
    if a.is_python_constant() and b.is_python_constant():
        return result(a.as_python_constant() is b.as_python_constant())
    ia, ib = _identity(a), _identity(b)
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


def contains_op(tx, container: VariableTracker, item: VariableTracker) -> VariableTracker:
    from .containers import BaseSequenceVariable, ConstDictVariable

    if isinstance(container, ConstDictVariable):
        try:
            return ConstantVariable(item.as_python_constant() in container.items)
        except NotConstant:
            raise Unsupported("`in` on a dict with a non-constant key") from None
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
        ident = _identity(item)
        if ident is not None and all(_identity(el) is not None for el in container.items):
            return ConstantVariable(any(_identity(el) is ident for el in container.items))
    raise Unsupported(f"`in` between {item.describe()} and {container.describe()}")


# -- handlers for individual builtins -------------------------------------------------


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
        return ConstantVariable(len(x.module))
    return None


def _python_type_of(tx, v: VariableTracker) -> type:
    return v.python_type()


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


def _b_issubclass(tx, args, kwargs):
    cargs, ckwargs = _const_args(args, kwargs, "issubclass")
    return ConstantVariable(issubclass(*cargs, **ckwargs))


def _b_type(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    typ = args[0].python_type()
    from .misc import wrap_class

    return wrap_class(typ)


def _b_iter(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if len(args) != 1 or kwargs:
        return None
    if isinstance(args[0], ListIteratorVariable):
        return args[0]
    return ListIteratorVariable(tx.unpack_sequence(args[0]))


def _b_next(tx, args, kwargs):
    from .containers import ListIteratorVariable

    if not args or kwargs or not isinstance(args[0], ListIteratorVariable):
        return None
    item = args[0].next_item()
    if item is None:
        if len(args) == 2:
            return args[1]
        raise Unsupported("next() on an exhausted iterator (StopIteration)")
    return item


def _b_enumerate(tx, args, kwargs):
    from .containers import ListIteratorVariable, TupleVariable

    if not args:
        return None
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    try:
        s = start.as_python_constant()
    except NotConstant:
        raise Unsupported("enumerate() with a non-constant start") from None
    items = tx.unpack_sequence(args[0])
    return ListIteratorVariable([TupleVariable([ConstantVariable(s + i), it])
                                 for i, it in enumerate(items)])


def _b_zip(tx, args, kwargs):
    from .containers import ListIteratorVariable, TupleVariable

    if kwargs and set(kwargs) != {"strict"}:
        return None
    seqs = [tx.unpack_sequence(a) for a in args]
    return ListIteratorVariable([TupleVariable(list(group)) for group in zip(*seqs, strict=False)])


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


def _b_dict(tx, args, kwargs):
    from .containers import ConstDictVariable

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
                try:
                    items[k.as_python_constant()] = v
                except NotConstant:
                    raise Unsupported("dict() with a non-constant key") from None
    items.update(kwargs)
    return ConstDictVariable(items)


def _b_getattr(tx, args, kwargs):
    if kwargs or len(args) not in (2, 3):
        return None
    try:
        name = args[1].as_python_constant()
    except NotConstant:
        raise Unsupported("getattr() with a non-constant name") from None
    if len(args) == 3:
        try:
            return tx.getattr(args[0], name)
        except Unsupported as e:
            if "has no attribute" in str(e):
                return args[2]
            raise
    return tx.getattr(args[0], name)


def _b_hasattr(tx, args, kwargs):
    if kwargs or len(args) != 2:
        return None
    try:
        name = args[1].as_python_constant()
    except NotConstant:
        raise Unsupported("hasattr() with a non-constant name") from None
    obj = _identity(args[0])
    if obj is not None and not isinstance(obj, torch.Tensor):
        return ConstantVariable(hasattr(obj, name))
    from .tensor import TensorVariable

    if isinstance(args[0], TensorVariable):
        return ConstantVariable(hasattr(args[0].example_value, name))
    return None


def _b_sum(tx, args, kwargs):
    if kwargs or not args or len(args) > 2:
        return None
    items = tx.unpack_sequence(args[0])
    if not _has_tensor(items):
        return None
    acc = args[1] if len(args) == 2 else ConstantVariable(0)
    for it in items:
        acc = call_operator(tx, operator.add, [acc, it], {})
    return acc


def _b_minmax(fn):
    def handler(tx, args, kwargs):
        if kwargs:
            return None
        items = tx.unpack_sequence(args[0]) if len(args) == 1 else list(args)
        if _has_tensor(items):
            raise Unsupported(f"{fn.__name__}() over tensors (data-dependent)")
        return None

    return handler


def _b_abs(tx, args, kwargs):
    if len(args) == 1 and _has_tensor(args):
        return tx.output.create_graph_op("call_function", operator.abs, list(args), {})
    return None


def _b_scalar_cast(fn):
    def handler(tx, args, kwargs):
        if _has_tensor(args):
            raise Unsupported(f"{fn.__name__}() of a tensor (data-dependent)")
        return None

    return handler


def _b_callable(tx, args, kwargs):
    if len(args) != 1:
        return None
    obj = _identity(args[0])
    if obj is not None:
        return ConstantVariable(callable(obj))
    return None


_BUILTIN_HANDLERS: dict[Any, Any] = {
    len: _b_len,
    isinstance: _b_isinstance,
    issubclass: _b_issubclass,
    type: _b_type,
    iter: _b_iter,
    next: _b_next,
    enumerate: _b_enumerate,
    zip: _b_zip,
    reversed: _b_reversed,
    tuple: _b_tuple_list(tuple),
    list: _b_tuple_list(list),
    dict: _b_dict,
    getattr: _b_getattr,
    hasattr: _b_hasattr,
    sum: _b_sum,
    min: _b_minmax(min),
    max: _b_minmax(max),
    abs: _b_abs,
    int: _b_scalar_cast(int),
    float: _b_scalar_cast(float),
    bool: _b_scalar_cast(bool),
    callable: _b_callable,
}

#: builtins that are classes (tuple, list, range...) are wrapped as BuiltinVariable too
BUILTIN_CLASSES = frozenset({
    int, float, bool, str, tuple, list, dict, set, frozenset, slice, range, enumerate, zip,
    reversed, type, bytes, complex, object,
})


def is_builtin_callable(value: Any) -> bool:
    return (value in _BUILTIN_HANDLERS or value in _FOLDABLE_BUILTINS or
            value in _OPERATOR_FNS or value in BUILTIN_CLASSES or
            getattr(value, "__module__", None) in ("builtins", "_operator", "operator"))

