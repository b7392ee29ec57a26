"""The ops-handler base of the C-like codegens (kiln_loopir.ops_handler): the spec check, the
dispatch from an op name to its spelling, and the result dtype of the spec."""

import pytest
import torch
from kiln_loopir.ops_handler import (
    CLikeOpsHandler,
    HandlerSpecError,
    bool_or,
    call,
    float_only,
    unless_bool,
)
from kiln_loopir.ops_spec import OPS, missing_ops
from kiln_loopir.virtualized import ops, set_ops_handler

#: the ops a toy handler writes as methods, not spellings
_METHODS = ("load", "store", "reduction", "store_reduction", "index_expr", "indirect_indexing",
            "constant", "to_dtype", "where")


class Val:
    def __init__(self, text, dtype):
        self.text, self.dtype = text, dtype

    def __str__(self):
        return self.text


def _methods(skip=()):
    def method(name):
        return lambda self, *args: (name, args)

    return {name: method(name) for name in _METHODS if name not in skip}


def _spellings(skip=()):
    """Every pure op not spelled by the base: a call of the op's name."""
    return {**CLikeOpsHandler.SPELLINGS,
            **{name: call(name) for name in OPS
               if name not in _METHODS and name not in CLikeOpsHandler.SPELLINGS and name not in skip}}


def _handler(skip_spelling=(), skip_method=(), **kwargs):
    namespace = {"SPELLINGS": _spellings(skip_spelling), **_methods(skip_method),
                 "bind": lambda self, text, dtype, operands: Val(text, dtype)}
    return type("ToyOps", (CLikeOpsHandler,), namespace, **kwargs)


def test_a_handler_lacking_a_spelled_op_fails_with_its_name():
    with pytest.raises(HandlerSpecError, match=r"ToyOps does not implement op\(s\) erfinv of") as e:
        _handler(skip_spelling=("erfinv",))
    assert e.value.missing == ["erfinv"]


def test_a_handler_lacking_a_method_fails_with_its_name():
    with pytest.raises(HandlerSpecError, match=r"op\(s\) store_reduction of"):
        _handler(skip_method=("store_reduction",))


def test_a_complete_handler_must_bind_its_values():
    namespace = {"SPELLINGS": _spellings(), **_methods()}
    with pytest.raises(TypeError, match="ToyOps spells ops but does not bind them"):
        type("ToyOps", (CLikeOpsHandler,), namespace)


def test_a_partial_handler_may_lack_ops():
    h = _handler(skip_method=("load", "store"), partial=True)
    assert missing_ops(h) == ["load", "store"]


def test_a_spelling_of_no_op_is_refused():
    namespace = {"SPELLINGS": {**_spellings(), "frobnicate": call("frob")}}
    with pytest.raises(HandlerSpecError, match="spells unknown op.* frobnicate"):
        type("ToyOps", (CLikeOpsHandler,), namespace, partial=True)


def test_an_op_both_spelled_and_defined_is_refused():
    namespace = {"SPELLINGS": _spellings(), "exp": lambda self, x: x}
    with pytest.raises(HandlerSpecError, match="both spells and defines op.* exp"):
        type("ToyOps", (CLikeOpsHandler,), namespace, partial=True)


def test_a_complete_handler_has_every_op_as_a_method():
    h = _handler()
    assert missing_ops(h) == []
    assert all(callable(getattr(h, name)) for name in OPS)


def test_dispatch_spells_the_operands_with_the_spec_dtype():
    h = _handler()()
    a, b = Val("a", torch.float32), Val("b", torch.float32)
    with set_ops_handler(h):
        s = ops.add(a, ops.exp(b))
        c = ops.lt(a, b)
        n = ops.neg(a)
    assert (str(s), s.dtype) == ("a + exp(b)", torch.float32)
    assert (str(c), c.dtype) == ("a < b", torch.bool)  # the spec's "bool" rule
    assert str(n) == "-a"


def test_spelling_forms_by_dtype():
    f, i, b = torch.float32, torch.int64, torch.bool
    assert float_only(call("floor"))("x", dtype=f) == "floor(x)"
    assert float_only(call("floor"))("x", dtype=i) == "x"
    assert unless_bool(call("abs"))("x", dtype=b) == "x"
    assert unless_bool(call("abs"))("x", dtype=i) == "abs(x)"
    either = bool_or(call("any"), call("sum"))
    assert (either("x", "y", dtype=b), either("x", "y", dtype=f)) == ("any(x, y)", "sum(x, y)")
