"""NumPy with ``fullgraph=True`` (issue 10): ``t.numpy()`` and NumPy calls on it are traced
into the graph as tensor code (torch._numpy), and NumPy arrays used as constants are graph
inputs read at every call (``torch.from_numpy(arr)``): an array written between calls gives
the new answer, not a stale one."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported

np = pytest.importorskip("numpy")



pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _close(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected)
        for a, e in zip(actual, expected, strict=True):
            _close(a, e)
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert type(actual) is type(expected), (type(actual), type(expected))
        np.testing.assert_allclose(actual, expected, rtol=1e-6)
        assert actual.dtype == expected.dtype
    else:
        torch.testing.assert_close(actual, expected)


def _check(fn, *calls, graphs=1):
    backend = CountingBackend()
    compiled = kiln_compile(fn, backend=backend, fullgraph=True)
    for make_args in calls:
        _close(compiled(*make_args()), fn(*make_args()))
    assert len(backend.graphs) == graphs, [gm.code for gm in backend.graphs]
    return backend.graphs


SCALE = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


def test_tensor_numpy_roundtrip_in_one_graph():
    def f(x):
        return torch.from_numpy(x.numpy() * 2 + 1)

    (gm,) = _check(f, lambda: (torch.arange(4.0),))
    assert "np." not in gm.code  # the graph is tensor code (was: NameError: np)


def test_numpy_functions_and_methods():
    def f(x):
        a = x.numpy()
        return np.mean(a), np.sin(a).sum(axis=0), a.T.reshape(-1), np.linalg.norm(a)

    _check(f, lambda: (torch.arange(6.0).reshape(2, 3),))


def test_numpy_type_promotion_is_numpy_s():
    def f(x, y):
        # int64 / int and int64 + float32: float64 in NumPy (float32 in torch)
        return x.numpy() / 2, x.numpy() + y.numpy()

    _check(f, lambda: (torch.arange(4), torch.ones(4)))


def test_ndarray_item_assignment_writes_through():
    def f(x):
        a = x.numpy()
        a[0] = 7.0
        b = a.copy()
        b[1:] = 0.0
        return torch.from_numpy(b), x

    _check(f, lambda: (torch.ones(4),))


def test_global_array_is_read_at_every_call():
    def f(x):
        return x * torch.from_numpy(SCALE) + torch.as_tensor(SCALE)

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    x = torch.ones(4)
    torch.testing.assert_close(compiled(x), f(x))
    saved = SCALE.copy()
    try:
        SCALE[0] = 10.0  # written between calls: no stale answer, no recompile
        torch.testing.assert_close(compiled(x), f(x))
        assert compiled(x)[0].item() == 20.0
    finally:
        SCALE[:] = saved
    assert len(backend.graphs) == 1


def test_replaced_or_retyped_global_array_recompiles():
    global SCALE
    saved = SCALE

    def f(x):
        return x * torch.from_numpy(SCALE)

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    try:
        torch.testing.assert_close(compiled(torch.ones(4)), f(torch.ones(4)))
        SCALE = np.arange(4, dtype=np.float64)  # another dtype: TENSOR_MATCH fails
        torch.testing.assert_close(compiled(torch.ones(4)), f(torch.ones(4)))
        SCALE = [1.0, 2.0]  # not an array any more: the guard fails (no stale graph runs);
        # tracing again meets what eager raises
        with pytest.raises((TypeError, Unsupported), match="expected np.ndarray"):
            compiled(torch.ones(4))
    finally:
        SCALE = saved
    assert len(backend.graphs) == 2


def test_torch_tensor_of_an_array_copies():
    def f(x):
        a = x.numpy()
        t = torch.tensor(a)
        t.add_(1)
        return t, x

    _check(f, lambda: (torch.zeros(3),))


def test_numpy_random_is_refused():
    def f(x):
        return x + torch.from_numpy(np.random.rand(3))

    with pytest.raises(Unsupported, match="random"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.zeros(3))


def test_numpy_of_a_tensor_that_requires_grad_breaks():
    def f(x):
        return torch.from_numpy(x.numpy())

    with pytest.raises(Unsupported, match="requires grad"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.zeros(3, requires_grad=True))
