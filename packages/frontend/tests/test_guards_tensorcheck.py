"""TensorGuard's C++ fast path (``kiln_frontend._tensorcheck``, reading the TensorImpl)
gives the same answer as the Python-attribute path (``PyTensorGuardFallback``) on every pair
of tensors below, including metadata changed in place on the same object (``p.data = ...``,
``requires_grad_``, ``t_()``), which an identity guard cannot see."""

from __future__ import annotations

import itertools

import pytest
import torch
from kiln_frontend.guards import USING_C_TENSOR_GUARD, PyTensorGuardFallback, TensorGuard

pytestmark = pytest.mark.skipif(not USING_C_TENSOR_GUARD, reason="C extension not built")


class _Sub(torch.Tensor):
    pass


def _tensors():
    base = torch.randn(4, 3)
    with torch.inference_mode():
        inference = torch.randn(4, 3)
    cplx = torch.randn(4, 3, dtype=torch.cfloat)
    return {
        "float": base,
        "transposed": torch.randn(3, 4).t(),
        "double": base.double(),
        "requires_grad": base.clone().requires_grad_(),
        "parameter": torch.nn.Parameter(base.clone()),
        "meta": torch.empty(4, 3, device="meta"),
        "complex": cplx,
        "conj": cplx.conj(),
        "neg": torch._neg_view(cplx),
        "inference": inference,
        "subclass": base.clone().as_subclass(_Sub),
        "sparse": base.to_sparse(),
        "bigger": torch.randn(5, 3),
        "3d": torch.randn(4, 3, 1),
        "scalar": torch.tensor(1.0),
        "sliced": torch.randn(4, 6)[:, ::2],
    }


TENSORS = _tensors()


def test_fast_path_is_used():
    guard = TensorGuard(TENSORS["float"])
    if not getattr(guard, "fast", False):
        pytest.skip("_tensorcheck not built (no torch headers at build time)")
    assert guard(TENSORS["float"])


@pytest.mark.parametrize("expected,actual", list(itertools.product(TENSORS, TENSORS)))
def test_same_answer_as_python_path(expected, actual):
    e, a = TENSORS[expected], TENSORS[actual]
    try:
        slow = PyTensorGuardFallback(e)(a)
    except Exception:  # noqa: BLE001 - the C guard counts an exception as a miss
        slow = False
    fast = TensorGuard(e)
    try:
        result = fast(a)
    except Exception:  # noqa: BLE001
        result = False
    assert result is slow, (expected, actual)
    assert result is (expected == actual), (expected, actual)  # each differs in something


def test_dynamic_dims_fast():
    guard = TensorGuard(torch.randn(4, 3), dynamic_dims=(0,))
    assert guard(torch.randn(7, 3))
    assert not guard(torch.randn(7, 4))


def test_metadata_changed_on_the_same_object():
    p = torch.nn.Parameter(torch.randn(4, 3))
    guard = TensorGuard(p)
    assert guard(p)
    p.data = torch.randn(4, 3, dtype=torch.float64)
    assert not guard(p)
    p.data = torch.randn(4, 3)
    assert guard(p)
    p.requires_grad_(False)
    assert not guard(p)
    p.requires_grad_(True)
    with torch.no_grad():
        p.t_()
    assert not guard(p)
