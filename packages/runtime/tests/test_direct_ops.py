"""``aten`` in generated wrappers (``kiln_runtime.launch.DirectOps``): the same operators,
called without the Python ``OpOverload.__call__`` frame."""

from __future__ import annotations

import pytest
import torch
from kiln_runtime.launch import HELPERS, TORCH_BINDINGS, aten_direct, empty_strided_cpu


def test_overloads_are_the_operators_own_callables():
    assert aten_direct.max.dim is torch.ops.aten.max.dim._op
    assert aten_direct.mm.out is torch.ops.aten.mm.out._op
    assert HELPERS["aten_direct"] is aten_direct


def test_matmuls_and_convolution_call_torchs_own_functions():
    # torch.mm parses its arguments into an unboxed call; _op boxes them first (slower)
    assert aten_direct.mm.default is torch.mm
    assert aten_direct.addmm.default is torch.addmm
    assert aten_direct.convolution.default is torch.convolution


def test_torch_bindings_name_real_overloads_and_compute_the_same():
    for key in TORCH_BINDINGS:
        name, overload = key.split(".")
        assert overload in getattr(torch.ops.aten, name).overloads(), key
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    x, y, z = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    w, image = torch.randn(6, 3, 3, 3), torch.randn(1, 3, 8, 8)
    calls = {
        "mm.default": ((a, b), {}),
        "bmm.default": ((x, y), {}),
        "addmm.default": ((c, a, b), {"beta": 0.5, "alpha": 2.0}),
        "baddbmm.default": ((z, x, y), {"beta": 0.5, "alpha": 2.0}),
        "convolution.default": ((image, w, torch.randn(6), [2, 1], [1, 0], [1, 1], False,
                                 [0, 0], 1), {}),
    }
    assert set(calls) == set(TORCH_BINDINGS)
    for key, (args, kwargs) in calls.items():
        name, overload = key.split(".")
        want = getattr(getattr(torch.ops.aten, name), overload)(*args, **kwargs)
        got = getattr(getattr(aten_direct, name), overload)(*args, **kwargs)
        assert type(got) is torch.Tensor, key
        torch.testing.assert_close(got, want, msg=key)


def test_empty_strided_cpu_makes_the_asked_layout_on_the_cpu():
    t = empty_strided_cpu((4, 3), (1, 4), torch.float16)
    assert (t.shape, t.stride(), t.dtype, t.device.type) == ((4, 3), (1, 4), torch.float16, "cpu")
    with torch.device("meta"):  # an explicit device: a device context does not move it
        assert empty_strided_cpu((2,), (1,), torch.float32).device.type == "cpu"


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
