"""``match`` statements (MATCH_SEQUENCE, MATCH_MAPPING, MATCH_KEYS, MATCH_CLASS, GET_LEN).

Each is decided while tracing from what a tracker knows: its Python type (guarded as for
``isinstance``), its length, its keys and its attributes, through the same builtins
``len``/``hasattr``/``getattr``/``in`` trace, so a pattern reads no state those do not
guard.  The opcodes mean the same on 3.11-3.13: MATCH_KEYS and MATCH_CLASS push a tuple of
values or None."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler
from ..variables.builtins import BuiltinVariable
from ..variables.constant import ConstantVariable
from ..variables.containers import TupleVariable
from ..variables.operators import contains_op

#: CPython's type flags that MATCH_SEQUENCE and MATCH_MAPPING test (Include/object.h)
_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6

#: classes whose one positional sub-pattern matches the subject itself (PEP 634)
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


def _flag(tx, value, flag: int) -> bool:
    return bool(tx.realize(value).python_type().__flags__ & flag)


def _call(tx, fn, *args):
    return tx.realize(BuiltinVariable(fn).call_function(tx, list(args), {}))


@handler("GET_LEN")
def GET_LEN(tx, inst):
    tx.push(_call(tx, len, tx.peek(1)))


@handler("MATCH_SEQUENCE")
def MATCH_SEQUENCE(tx, inst):
    tx.push(ConstantVariable(_flag(tx, tx.peek(1), _TPFLAGS_SEQUENCE)))


@handler("MATCH_MAPPING")
def MATCH_MAPPING(tx, inst):
    tx.push(ConstantVariable(_flag(tx, tx.peek(1), _TPFLAGS_MAPPING)))


@handler("MATCH_KEYS")
def MATCH_KEYS(tx, inst):
    """Subject and keys stay; pushes the values of the keys, or None if one is missing."""
    keys = tx.realize(tx.peek(1))
    subject = tx.realize(tx.peek(2))
    values = []
    for key in tx.unpack_sequence(keys):
        if not contains_op(tx, subject, tx.realize(key)).as_python_constant():
            tx.push(ConstantVariable(None))
            return
        values.append(tx.getitem(subject, key))
    tx.push(TupleVariable(values))


@handler("MATCH_CLASS")
def MATCH_CLASS(tx, inst):
    """Pops subject, class and keyword names; pushes the matched attributes (positional
    ones through ``__match_args__``, read on the class tracker so it is guarded) or None."""
    names = tx.realize(tx.pop()).as_python_constant()
    cls_var = tx.realize(tx.pop())
    subject = tx.realize(tx.pop())
    try:
        cls = cls_var.as_python_constant()
    except Exception:  # noqa: BLE001
        raise Unsupported(f"match on class pattern {cls_var.describe()}") from None
    if not isinstance(cls, type):
        raise Unsupported(f"match on class pattern {cls!r} that is not a class")
    if not _call(tx, isinstance, subject, cls_var).as_python_constant():
        tx.push(ConstantVariable(None))
        return
    count = inst.arg
    attrs = []
    if count and not hasattr(cls, "__match_args__") and issubclass(cls, _SELF_MATCHING):
        if count > 1:
            raise Unsupported(f"match on {cls.__name__} with {count} positional patterns "
                              "(eager: TypeError)")
        attrs.append(subject)  # int(x), str(s)...: the subject itself
        positional = []
    elif count:
        match_args = tx.realize(tx.getattr(cls_var, "__match_args__")) \
            if hasattr(cls, "__match_args__") else ConstantVariable(())
        match_args = match_args.as_python_constant()
        if not isinstance(match_args, tuple) or count > len(match_args):
            raise Unsupported(f"match on {cls.__name__} with {count} positional patterns "
                              "(eager: TypeError)")
        positional = list(match_args[:count])
    else:
        positional = []
    for name in [*positional, *names]:
        if not _call(tx, hasattr, subject, ConstantVariable(name)).as_python_constant():
            tx.push(ConstantVariable(None))
            return
        attrs.append(tx.getattr(subject, name))
    tx.push(TupleVariable(attrs))
