"""The C TensorGuard of kiln_frontend._evalframe (needs torch)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from kiln_frontend._evalframe import TensorGuard  # noqa: E402


def test_accepts_equal_tensor():
    t = torch.randn(3, 4)
    g = TensorGuard(t)
    assert g(t) is True
    assert g(torch.zeros(3, 4)) is True
    assert g.reason(torch.zeros(3, 4)) is None


@pytest.mark.parametrize(
    "value, reason",
    [
        (torch.randn(3, 4, dtype=torch.float64), "dtype mismatch: expected torch.float32, actual torch.float64"),
        (torch.randn(4, 4), "size mismatch at index 0: expected 3, actual 4"),
        (torch.randn(3, 5), "size mismatch at index 1: expected 4, actual 5"),
        (torch.randn(3, 4, 1), "ndim mismatch: expected 2, actual 3"),
        (torch.randn(4, 3).t(), "stride mismatch at index 0: expected 4, actual 1"),
        (torch.randn(3, 4, device="meta"), "device mismatch: expected cpu, actual meta"),
        (torch.randn(3, 4, requires_grad=True), "requires_grad mismatch: expected False, actual True"),
        (torch.nn.Parameter(torch.randn(3, 4), requires_grad=False),
         "class mismatch: expected torch.Tensor, actual torch.nn.parameter.Parameter"),
        (3, "class mismatch: expected torch.Tensor, actual int"),
        (None, "class mismatch: expected torch.Tensor, actual NoneType"),
    ],
    ids=["dtype", "size0", "size1", "ndim", "stride", "device", "requires_grad", "class", "int", "none"],
)
def test_rejects_with_readable_reason(value, reason):
    g = TensorGuard(torch.randn(3, 4))
    assert g(value) is False
    assert g.reason(value) == reason


def test_dispatch_keys():
    g = TensorGuard(torch.randn(3))
    with torch.inference_mode():
        inf = torch.randn(3)
    assert g(inf) is False
    assert g.reason(inf).startswith("dispatch key set mismatch: expected DispatchKeySet(")
    assert g.dispatch_keys == torch._C._dispatch_keys(torch.randn(3))


def test_dynamic_dims_match_any_size_and_skip_their_stride():
    g = TensorGuard(torch.randn(3, 4), dynamic_dims=(0,))
    assert g.dynamic_dims == (0,)
    assert g.sizes == (None, 4)
    assert g.strides == (None, 1)
    assert g(torch.randn(7, 4)) and g(torch.randn(1, 4))
    assert not g(torch.randn(7, 5))
    assert g.reason(torch.randn(7, 5)) == "size mismatch at index 1: expected 4, actual 5"
    # negative dims count from the end; duplicates collapse
    g2 = TensorGuard(torch.randn(2, 3, 4), dynamic_dims=[-1, 2, 0])
    assert g2.dynamic_dims == (0, 2)
    assert g2(torch.randn(5, 3, 4))
    # only the dynamic dims' own strides go unchecked: dim 1's stride (= size of dim 2 for a
    # contiguous tensor) still is; callers wanting otherwise pass check_strides=False
    assert g2.reason(torch.randn(5, 3, 9)) == "stride mismatch at index 1: expected 4, actual 9"
    assert TensorGuard(torch.randn(2, 3, 4), dynamic_dims=[2], check_strides=False)(torch.randn(2, 3, 9))
    with pytest.raises(IndexError):
        TensorGuard(torch.randn(2, 3), dynamic_dims=(2,))


def test_check_strides_false():
    g = TensorGuard(torch.randn(3, 4), check_strides=False)
    assert g(torch.randn(4, 3).t())
    assert "unchecked" in repr(g)
    assert not g.check_strides


def test_scalar_tensor_and_attributes():
    t = torch.tensor(2.0)
    g = TensorGuard(t)
    assert g(torch.tensor(5.0)) and not g(torch.tensor([5.0]))
    assert g.ndim == 0 and g.sizes == () and g.strides == ()
    assert g.dtype is torch.float32 and g.device == torch.device("cpu")
    assert g.cls is torch.Tensor and g.requires_grad is False


def test_repr_names_what_it_checks():
    g = TensorGuard(torch.randn(3, 4), dynamic_dims=(1,))
    r = repr(g)
    assert r.startswith("TensorGuard(torch.Tensor, dtype=torch.float32, device=cpu, requires_grad=False")
    assert "size=[3, *]" in r and "stride=[4, *]" in r and "dispatch_keys=DispatchKeySet(" in r


def test_guard_runs_no_python_frames():
    g = TensorGuard(torch.randn(3, 4))
    t = torch.randn(3, 4)
    events = []

    def profiler(frame, event, arg):
        if event == "call":
            events.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        for _ in range(3):
            g(t)
            g(torch.randn(4, 4).t())
    finally:
        sys.setprofile(None)
    assert events == []


def test_wrong_call_arity_and_non_tensor_expected():
    g = TensorGuard(torch.randn(2))
    with pytest.raises(TypeError):
        g()
    with pytest.raises(TypeError):
        g(1, 2)
    with pytest.raises(AttributeError):
        TensorGuard(3)


def test_guard_holds_no_reference_to_the_tensor():
    import weakref

    t = torch.randn(3)
    ref = weakref.ref(t)
    g = TensorGuard(t)
    del t
    assert ref() is None
    assert g(torch.randn(3))
