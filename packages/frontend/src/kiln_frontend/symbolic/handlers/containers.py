"""Building, unpacking and indexing tuples, lists, dicts and slices."""

from __future__ import annotations

import operator

from ...exc import Unsupported
from ..registry import handler
from ..variables import (
    ConstantVariable,
    ConstDictVariable,
    ListVariable,
    SliceVariable,
    TensorVariable,
    TupleVariable,
)
from ..variables.base import NotConstant
from ..variables.containers import dict_key


@handler("BUILD_TUPLE")
def BUILD_TUPLE(tx, inst):
    tx.push(TupleVariable(tx.popn(inst.arg)))


@handler("BUILD_LIST")
def BUILD_LIST(tx, inst):
    tx.push(ListVariable(tx.popn(inst.arg)))


@handler("LIST_TO_TUPLE", versions=(3, 11))
def LIST_TO_TUPLE(tx, inst):
    tx.push(TupleVariable(tx.unpack_sequence(tx.pop())))


@handler("LIST_APPEND")
def LIST_APPEND(tx, inst):
    value = tx.pop()
    target = tx.peek(inst.arg)
    if not isinstance(target, ListVariable):
        raise Unsupported("LIST_APPEND on a non-list")
    target.items.append(value)


@handler("LIST_EXTEND")
def LIST_EXTEND(tx, inst):
    seq = tx.pop()
    target = tx.peek(inst.arg)
    if not isinstance(target, ListVariable):
        raise Unsupported("LIST_EXTEND on a non-list")
    target.items.extend(tx.unpack_sequence(seq))


@handler("BUILD_MAP")
def BUILD_MAP(tx, inst):
    flat = tx.popn(2 * inst.arg)
    items = {}
    for k, v in zip(flat[::2], flat[1::2], strict=True):
        items[dict_key(tx, k)] = v
    tx.push(ConstDictVariable(items))


@handler("BUILD_CONST_KEY_MAP")
def BUILD_CONST_KEY_MAP(tx, inst):
    keys = tx.pop().as_python_constant()
    values = tx.popn(inst.arg)
    tx.push(ConstDictVariable(dict(zip(keys, values, strict=True))))


@handler("MAP_ADD")
def MAP_ADD(tx, inst):
    value = tx.pop()
    key = tx.pop()
    target = tx.peek(inst.arg)
    if not isinstance(target, ConstDictVariable):
        raise Unsupported("MAP_ADD on a non-dict")
    target.items[dict_key(tx, key)] = value


@handler("DICT_UPDATE", "DICT_MERGE")
def DICT_UPDATE(tx, inst):
    other = tx.realize(tx.pop())
    target = tx.peek(inst.arg)
    if not isinstance(other, ConstDictVariable) or not isinstance(target, ConstDictVariable):
        raise Unsupported(f"{inst.opname} with a non-dict")
    target.items.update(other.items)


@handler("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(tx, inst):
    items = tx.unpack_sequence(tx.pop())
    if len(items) != inst.arg:
        raise Unsupported(f"unpacking {len(items)} values into {inst.arg} names")
    for item in reversed(items):
        tx.push(item)


@handler("UNPACK_EX")
def UNPACK_EX(tx, inst):
    before = inst.arg & 0xFF
    after = inst.arg >> 8
    items = tx.unpack_sequence(tx.pop())
    if len(items) < before + after:
        raise Unsupported("not enough values to unpack")
    head = items[:before]
    mid = items[before:len(items) - after]
    tail = items[len(items) - after:]
    for item in reversed(tail):
        tx.push(item)
    tx.push(ListVariable(mid))
    for item in reversed(head):
        tx.push(item)


@handler("BINARY_SUBSCR")
def BINARY_SUBSCR(tx, inst):
    index = tx.pop()
    obj = tx.pop()
    tx.push(tx.getitem(obj, tx.realize(index)))


def _setitem(tx, obj, index, value):
    obj = tx.realize(obj)
    if isinstance(obj, TensorVariable):
        tx.output.create_graph_op("call_function", operator.setitem, [obj, index, value], {},
                                  mutation=True)
        return
    if hasattr(obj, "setitem"):
        obj.setitem(tx, index, value)
        return
    raise Unsupported(f"item assignment on {obj.describe()}")


@handler("STORE_SUBSCR")
def STORE_SUBSCR(tx, inst):
    index = tx.realize(tx.pop())
    obj = tx.pop()
    value = tx.realize(tx.pop())
    _setitem(tx, obj, index, value)


@handler("DELETE_SUBSCR")
def DELETE_SUBSCR(tx, inst):
    from ..side_effects import delete_subscr

    index = tx.realize(tx.pop())
    delete_subscr(tx, tx.realize(tx.pop()), index)


def _slice(parts):
    if all(p.is_python_constant() for p in parts):
        return ConstantVariable(slice(*[p.as_python_constant() for p in parts]))
    return SliceVariable(parts)


@handler("BUILD_SLICE")
def BUILD_SLICE(tx, inst):
    tx.push(_slice([tx.realize(p) for p in tx.popn(inst.arg)]))


@handler("BINARY_SLICE", versions=((3, 12), (3, 13)))
def BINARY_SLICE(tx, inst):
    end = tx.realize(tx.pop())
    start = tx.realize(tx.pop())
    container = tx.pop()
    tx.push(tx.getitem(container, _slice([start, end])))


@handler("STORE_SLICE", versions=((3, 12), (3, 13)))
def STORE_SLICE(tx, inst):
    end = tx.realize(tx.pop())
    start = tx.realize(tx.pop())
    container = tx.pop()
    value = tx.realize(tx.pop())
    _setitem(tx, container, _slice([start, end]), value)


@handler("BUILD_STRING")
def BUILD_STRING(tx, inst):
    parts = tx.popn(inst.arg)
    try:
        tx.push(ConstantVariable("".join(p.as_python_constant() for p in parts)))
    except NotConstant:
        raise Unsupported("building a string from non-constants") from None


_CONVERSIONS = {1: str, 2: repr, 3: ascii}


def _constant_to_format(value):
    try:
        return value.as_python_constant()
    except NotConstant:
        raise Unsupported(f"formatting {value.describe()}") from None


@handler("FORMAT_VALUE", versions=((3, 11), (3, 12)))
def FORMAT_VALUE(tx, inst):
    flags = inst.arg or 0
    spec = tx.pop().as_python_constant() if flags & 0x04 else ""
    v = _constant_to_format(tx.pop())
    conv = _CONVERSIONS.get(flags & 0x03)
    if conv is not None:
        v = conv(v)
    tx.push(ConstantVariable(format(v, spec)))


@handler("CONVERT_VALUE", versions=(3, 13))
def CONVERT_VALUE(tx, inst):
    """3.13 f-string ``!s``/``!r``/``!a``."""
    tx.push(ConstantVariable(_CONVERSIONS[inst.arg](_constant_to_format(tx.pop()))))


@handler("FORMAT_SIMPLE", versions=(3, 13))
def FORMAT_SIMPLE(tx, inst):
    tx.push(ConstantVariable(format(_constant_to_format(tx.pop()), "")))


@handler("FORMAT_WITH_SPEC", versions=(3, 13))
def FORMAT_WITH_SPEC(tx, inst):
    spec = tx.pop().as_python_constant()
    tx.push(ConstantVariable(format(_constant_to_format(tx.pop()), spec)))


@handler("BUILD_SET")
def BUILD_SET(tx, inst):
    from ..variables.containers import SetVariable

    tx.push(SetVariable([tx.realize(v) for v in tx.popn(inst.arg)], tx=tx))


@handler("SET_ADD")
def SET_ADD(tx, inst):
    from ..variables.containers import SetVariable

    value = tx.realize(tx.pop())
    target = tx.peek(inst.arg)
    if not isinstance(target, SetVariable):
        raise Unsupported("SET_ADD on a non-set")
    target.add(tx, value)


@handler("SET_UPDATE")
def SET_UPDATE(tx, inst):
    from ..variables.containers import SetVariable

    seq = tx.pop()
    target = tx.peek(inst.arg)
    if not isinstance(target, SetVariable):
        raise Unsupported("SET_UPDATE on a non-set")
    for item in tx.unpack_sequence(seq):
        target.add(tx, tx.realize(item))
