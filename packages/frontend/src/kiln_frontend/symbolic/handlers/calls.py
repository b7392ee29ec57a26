"""Calls: PRECALL/CALL/KW_NAMES (3.11), CALL/KW_NAMES (3.12), CALL/CALL_KW (3.13),
CALL_FUNCTION_EX, MAKE_FUNCTION (+ 3.13's SET_FUNCTION_ATTRIBUTE), PUSH_NULL,
CALL_INTRINSIC_1.

The NULL of a call sits below the callable on 3.11/3.12 (``[NULL, callable, *args]``, or
``[method, self, *args]``) and above it on 3.13 (``[callable, NULL, *args]``, or
``[method, self, *args]``)."""

from __future__ import annotations

import builtins

from ...exc import Unsupported
from ..registry import handler
from ..variables import ConstDictVariable, NestedUserFunctionVariable, NullVariable, TupleVariable
from ..variables.builtins import BuiltinVariable


@handler("PUSH_NULL")
def PUSH_NULL(tx, inst):
    tx.push(NullVariable())


@handler("LOAD_BUILD_CLASS")
def LOAD_BUILD_CLASS(tx, inst):
    """``builtins.__build_class__``: calling it (a class statement) breaks the graph at the
    CALL, where a break keeps the stack's NULL as any call's does (at this instruction
    3.11/3.12 have the NULL below it and no resume function)."""
    tx.push(BuiltinVariable(builtins.__build_class__))


@handler("PRECALL", versions=(3, 11))
def PRECALL(tx, inst):
    tx.call_prefix.append(inst)


@handler("KW_NAMES", versions=((3, 11), (3, 12)))
def KW_NAMES(tx, inst):
    tx.kw_names = tuple(inst.argval)
    tx.call_prefix.append(inst)


@handler("CALL", versions=((3, 11), (3, 12)))
def CALL(tx, inst):
    kw_names = tx.kw_names or ()
    tx.kw_names = None
    args = tx.popn(inst.arg)
    first, second = tx.popn(2)
    if isinstance(first, NullVariable):
        fn = second
    else:
        fn = first
        args = [second, *args]
    _call(tx, fn, args, kw_names)


@handler("CALL", versions=(3, 13))
def CALL_313(tx, inst):
    _call(tx, *_callable_and_args_313(tx, inst.arg), ())


@handler("CALL_KW", versions=(3, 13))
def CALL_KW(tx, inst):
    kw_names = tuple(tx.realize(tx.pop()).as_python_constant())
    _call(tx, *_callable_and_args_313(tx, inst.arg), kw_names)


def _callable_and_args_313(tx, argc: int):
    """3.13: ``[callable, self_or_null, *args]`` -> (callable, [self, *args] or args)."""
    args = tx.popn(argc)
    fn, self_or_null = tx.popn(2)
    if not isinstance(self_or_null, NullVariable):
        args = [self_or_null, *args]
    return fn, args


def _call(tx, fn, args, kw_names):
    nkw = len(kw_names)
    pos = args[:len(args) - nkw]
    kwargs = dict(zip(kw_names, args[len(args) - nkw:], strict=True))
    result = tx.call_function(fn, pos, kwargs)
    tx.call_prefix = []
    tx.push(result)


@handler("CALL_FUNCTION_EX", versions=((3, 11), (3, 12)))
def CALL_FUNCTION_EX(tx, inst):
    flags = inst.arg or 0
    kwargs_var = tx.pop() if flags & 1 else None
    args_var = tx.realize(tx.pop())
    fn = tx.pop()
    null = tx.pop()
    if not isinstance(null, NullVariable):
        raise Unsupported("CALL_FUNCTION_EX without NULL (internal error)")
    _call_ex(tx, fn, args_var, kwargs_var)


@handler("CALL_FUNCTION_EX", versions=(3, 13))
def CALL_FUNCTION_EX_313(tx, inst):
    flags = inst.arg or 0
    kwargs_var = tx.pop() if flags & 1 else None
    args_var = tx.realize(tx.pop())
    null = tx.pop()
    fn = tx.pop()
    if not isinstance(null, NullVariable):
        # a method loaded without its method bit is pushed with a NULL too; anything else
        # here would be a self this handler does not model
        raise Unsupported("CALL_FUNCTION_EX without NULL (internal error)")
    _call_ex(tx, fn, args_var, kwargs_var)


def _call_ex(tx, fn, args_var, kwargs_var):
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


@handler("MAKE_FUNCTION", versions=((3, 11), (3, 12)))
def MAKE_FUNCTION(tx, inst):
    flags = inst.arg or 0
    code = tx.pop().as_python_constant()
    closure = tx.pop() if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = tx.pop() if flags & 0x02 else None
    defaults = tx.pop() if flags & 0x01 else None
    fn = _make_function(tx, code, defaults, kwdefaults, closure)
    fn.has_annotations = bool(flags & 0x04)
    tx.push(fn)


@handler("MAKE_FUNCTION", versions=(3, 13))
def MAKE_FUNCTION_313(tx, inst):
    """3.13: the bare function; SET_FUNCTION_ATTRIBUTE adds defaults, closure, ... after."""
    tx.push(_make_function(tx, tx.pop().as_python_constant(), None, None, None))


@handler("SET_FUNCTION_ATTRIBUTE", versions=(3, 13))
def SET_FUNCTION_ATTRIBUTE(tx, inst):
    fn = tx.pop()
    value = tx.pop()
    if not isinstance(fn, NestedUserFunctionVariable):
        raise Unsupported(f"SET_FUNCTION_ATTRIBUTE on {fn.describe()} (internal error)")
    flag = inst.arg or 0
    if flag == 0x04:  # annotations: not modelled (as on 3.11/3.12)
        fn.has_annotations = True
        tx.push(fn)
        return
    if flag not in (0x01, 0x02, 0x08):
        raise Unsupported(f"SET_FUNCTION_ATTRIBUTE {flag}")
    made = _make_function(tx, fn.code, value if flag == 0x01 else None,
                          value if flag == 0x02 else None, value if flag == 0x08 else None)
    # a new tracker: the attribute added to those already set
    new = NestedUserFunctionVariable(
        fn.code, fn.f_globals, fn.qualname,
        made.defaults if flag == 0x01 else fn.defaults,
        made.kwdefaults if flag == 0x02 else fn.kwdefaults,
        made.closure if flag == 0x08 else fn.closure)
    new.has_annotations = fn.has_annotations
    tx.push(new)


def _make_function(tx, code, defaults, kwdefaults, closure):
    closure_items = list(closure.items) if isinstance(closure, TupleVariable) else []
    defaults_items = tx.unpack_sequence(defaults) if defaults is not None else []
    kwdefaults_items = {}
    if kwdefaults is not None:
        if not isinstance(kwdefaults, ConstDictVariable):
            raise Unsupported("keyword defaults that are not a dict")
        kwdefaults_items = dict(kwdefaults.items)
    return NestedUserFunctionVariable(code, tx.f_globals, code.co_qualname, defaults_items,
                                      kwdefaults_items, closure_items)


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


@handler("CALL_INTRINSIC_1", versions=((3, 12), (3, 13)))
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



