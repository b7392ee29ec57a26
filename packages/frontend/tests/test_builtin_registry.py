"""The builtin and operator tables (symbolic/variables/builtins.py, operators.py): one handler
per callable, a builtin without one graph-breaks naming it, and the operator table's order
(any operands, then tensors, then Python values) gives eager's answers."""

from __future__ import annotations

import operator

import pytest
import torch
from _counting_backend import one_graph
from kiln_frontend import explain
from kiln_frontend.symbolic.variables.builtins import BUILTIN_CALLS, BuiltinVariable
from kiln_frontend.symbolic.variables.handler_table import HandlerTable
from kiln_frontend.symbolic.variables.operators import ON_ANY_OPERANDS, ON_PYTHON_VALUES

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def test_tables_refuse_a_second_handler():
    with pytest.raises(ValueError, match=r"builtin calls: len already has a handler"):
        BUILTIN_CALLS.register(len)(lambda tx, args, kwargs: None)
    with pytest.raises(ValueError, match=r"operator\.is_ already has a handler"):
        ON_ANY_OPERANDS.add(operator.is_, lambda tx, fn, args: None)
    with pytest.raises(ValueError, match=r"operator\.add already has a handler"):
        ON_PYTHON_VALUES.add(operator.add, lambda tx, fn, args: None)


def test_table_lookup_and_repr():
    table = HandlerTable("demo")

    @table.register(len, operator.neg)
    def handler(tx, args, kwargs):
        return None

    assert table.get(len) is handler and table.get(abs) is None
    assert len in table and abs not in table and len(table) == 2
    assert repr(table) == "HandlerTable('demo': len, operator.neg)"
    for fn in (len, isinstance, getattr, hasattr, min, max, sum, zip, enumerate):
        assert fn in BUILTIN_CALLS, fn


def test_builtin_without_handler_graph_breaks_naming_it():
    def f(x):
        x = x + 1
        print(end="")
        return x + 1

    result = explain(f)(torch.randn(2))
    assert [b.reason for b in result.break_reasons] == ["call to builtin print"]
    assert BuiltinVariable(print).describe() == "BuiltinVariable(print)"


def test_builtins_fold_and_trace():
    def f(x, xs):
        n = len(xs) + sum([1, 2]) + max(3, 4) + abs(-2)
        pairs = list(zip(range(2), xs, strict=True))
        if isinstance(x, torch.Tensor) and hasattr(x, "shape") and callable(f):
            return x * n + sum(i * t for i, t in pairs) + abs(x)
        return x

    one_graph(f, torch.randn(3), [torch.randn(3), torch.randn(3)])


def test_operator_table_order():
    def f(x, y):
        seq = [1, 2] + [3]
        seq *= 2
        z = x if x is not y else y
        n = 0
        n += z  # a Python number += a tensor: rebinds n to n + z
        same = operator.eq(torch.nn.functional.relu, torch.nn.functional.relu)
        return n * len(seq) + (3 in seq) + same + operator.getitem(seq, 0) + (not seq)

    one_graph(f, torch.randn(3), torch.randn(3))


def test_hasattr_on_constants_is_one_graph():
    # transformers 5.17's masking_utils: `hasattr(past_key_values, "is_sliding")` with None
    def f(x, cache=None, scale=2.0):
        if hasattr(cache, "is_sliding") or hasattr(scale, "nope"):
            return x - 1
        if hasattr(scale, "real") and hasattr("s", "upper"):
            return x * scale
        return x + 1

    gm = one_graph(f, torch.randn(3))  # checks eager's answer and one graph
    assert "mul" in gm.code
