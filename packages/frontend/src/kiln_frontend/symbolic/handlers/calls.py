"""Calls: PRECALL/CALL/KW_NAMES (3.11), CALL/KW_NAMES (3.12), CALL_FUNCTION_EX,
MAKE_FUNCTION, PUSH_NULL, CALL_INTRINSIC_1."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler
from ..variables import ConstDictVariable, NestedUserFunctionVariable, NullVariable, TupleVariable


@handler("PUSH_NULL")
def PUSH_NULL(tx, inst):
    tx.push(NullVariable())


@handler("PRECALL", versions=(3, 11))
def PRECALL(tx, inst):
    tx.call_prefix.append(inst)


@handler("KW_NAMES")
def KW_NAMES(tx, inst):
    tx.kw_names = tuple(inst.argval)
    tx.call_prefix.append(inst)


@handler("CALL")
def CALL(tx, inst):
    argc = inst.arg
    kw_names = tx.kw_names or ()
    tx.kw_names = None
    args = tx.popn(argc)
    first, second = tx.popn(2)
    if isinstance(first, NullVariable):
        fn = second
    else:
        fn = first
        args = [second, *args]
    nkw = len(kw_names)
    pos = args[:len(args) - nkw]
    kwargs = dict(zip(kw_names, args[len(args) - nkw:], strict=True))
    result = tx.call_function(fn, pos, kwargs)
    tx.call_prefix = []
    tx.push(result)


@handler("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(tx, inst):
    flags = inst.arg or 0
    kwargs_var = tx.pop() if flags & 1 else None
    args_var = tx.realize(tx.pop())
    fn = tx.pop()
    null = tx.pop()
    if not isinstance(null, NullVariable):
        raise Unsupported("CALL_FUNCTION_EX without NULL (internal error)")
    args = tx.unpack_sequence(args_var)
    kwargs = {}
    if kwargs_var is not None:
        kwargs_var = tx.realize(kwargs_var)
        if not isinstance(kwargs_var, ConstDictVariable):
            raise Unsupported(f"**{kwargs_var.describe()}")
        for k, v in kwargs_var.items.items():
            if not isinstance(k, str):
                raise Unsupported("keywords must be strings")
            kwargs[k] = v
    result = tx.call_function(fn, args, kwargs)
    tx.call_prefix = []
    tx.push(result)


@handler("MAKE_FUNCTION")
def MAKE_FUNCTION(tx, inst):
    flags = inst.arg or 0
    code = tx.pop().as_python_constant()
    closure = tx.pop() if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = tx.pop() if flags & 0x02 else None
    defaults = tx.pop() if flags & 0x01 else None
    closure_items = list(closure.items) if isinstance(closure, TupleVariable) else []
    defaults_items = tx.unpack_sequence(defaults) if defaults is not None else []
    kwdefaults_items = {}
    if kwdefaults is not None:
        if not isinstance(kwdefaults, ConstDictVariable):
            raise Unsupported("keyword defaults that are not a dict")
        kwdefaults_items = dict(kwdefaults.items)
    tx.push(NestedUserFunctionVariable(code, tx.f_globals, code.co_qualname, defaults_items,
                                       kwdefaults_items, closure_items))


_INTRINSIC_STOPITERATION_ERROR = 3
_INTRINSIC_UNARY_POSITIVE = 5
_INTRINSIC_LIST_TO_TUPLE = 6


def _stop_iteration_error(tx, exc):
    """3.12's handler around a generator's body (PEP 479): a StopIteration escaping it
    becomes RuntimeError('generator raised StopIteration'); any other exception passes."""
    import inspect

    from ..variables.constant import ConstantVariable
    from ..variables.exceptions import ExceptionVariable

    if not (tx.code.co_flags & inspect.CO_GENERATOR):
        raise Unsupported("StopIteration conversion outside a generator")
    if isinstance(exc, ExceptionVariable) and issubclass(exc.cls, StopIteration):
        new = ExceptionVariable(RuntimeError,
                                [ConstantVariable("generator raised StopIteration")])
        new.cause = new.context = exc
        new.suppress_context = True
        return new
    return exc


@handler("CALL_INTRINSIC_1", versions=(3, 12))
def CALL_INTRINSIC_1(tx, inst):
    import operator

    from ..variables.operators import call_operator

    which = inst.arg
    if which == _INTRINSIC_LIST_TO_TUPLE:
        tx.push(TupleVariable(tx.unpack_sequence(tx.pop())))
    elif which == _INTRINSIC_UNARY_POSITIVE:
        tx.push(call_operator(tx, operator.pos, [tx.pop()], {}))
    elif which == _INTRINSIC_STOPITERATION_ERROR:
        tx.push(_stop_iteration_error(tx, tx.pop()))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {which}")



