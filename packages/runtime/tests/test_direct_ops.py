"""``aten`` in generated wrappers (``kiln_runtime.launch.DirectOps``): the same operators,
called without the Python ``OpOverload.__call__`` frame."""

from __future__ import annotations

import pytest
import torch
from kiln_runtime.launch import HELPERS, aten_direct


def test_overloads_are_the_operators_own_callables():
    assert aten_direct.mm.default is torch.ops.aten.mm.default._op
    assert aten_direct.max.dim is torch.ops.aten.max.dim._op
    assert HELPERS["aten_direct"] is aten_direct


def test_calls_match_the_op_overloads():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(aten_direct.mm.default(a, b), torch.ops.aten.mm.default(a, b))
    values, indices = aten_direct.max.dim(a, 1, keepdim=False)
    expected = torch.ops.aten.max.dim(a, 1)
    torch.testing.assert_close(values, expected[0])
    torch.testing.assert_close(indices, expected[1])


def test_an_unknown_op_fails_with_its_name():
    with pytest.raises(AttributeError, match="no_such_op_here"):
        _ = aten_direct.no_such_op_here
