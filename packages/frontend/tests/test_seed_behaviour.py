"""The frontend's promises from the issue, end to end through the real hook and capture:
run() compiles nothing, what recompiles and what does not, and the seed docs' third-party
TorchScript backend working unchanged."""

from __future__ import annotations

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def affine(x):
    return x * 2 + 1


@pytest.fixture(autouse=True)
def fresh():
    kiln_frontend.reset()
    yield
    kiln_frontend.reset()


def test_run_compiles_nothing_and_runs_unseen_inputs_eagerly():
    backend = CountingBackend()
    compiled = kiln_frontend.optimize(backend)(toy_example)
    a, b = torch.randn(8), torch.randn(8).abs()
    compiled(a, b)
    compiled(a, -b)
    warm = len(backend.graphs)
    assert warm == 3

    cached_only = kiln_frontend.run(toy_example)
    for args in [(a, b), (a, -b), (a.double(), b.double()), (torch.randn(3, 5), torch.randn(3, 5))]:
        torch.testing.assert_close(cached_only(*args), toy_example(*args))
    assert len(backend.graphs) == warm  # float64 and 3x5 inputs ran eagerly, nothing compiled


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda x: x.double(), id="dtype"),
        pytest.param(lambda x: torch.randn(5, 3), id="shape"),
        pytest.param(lambda x: x.t(), id="stride"),
        pytest.param(lambda x: x.to("meta"), id="device"),
        pytest.param(lambda x: x.clone().requires_grad_(), id="requires_grad"),
    ],
)
def test_new_dtype_shape_stride_device_or_requires_grad_recompiles(change):
    backend = CountingBackend()
    compiled = kiln_frontend.optimize(backend, dynamic=False)(affine)
    x = torch.randn(3, 5)
    compiled(x)
    compiled(torch.randn(3, 5))  # same metadata: a cache hit
    assert len(backend.graphs) == 1
    y = change(x)
    out = compiled(y)
    assert len(backend.graphs) == 2
    if y.device.type != "meta":
        torch.testing.assert_close(out, affine(y))
    else:
        assert out.device.type == "meta" and out.shape == y.shape
    compiled(y)
    assert len(backend.graphs) == 2  # and the new entry is hit afterwards


def torchscript_backend(gm, example_inputs):
    """The third-party backend of torch.compile's docs, unchanged."""
    scripted = torch.jit.trace(gm, example_inputs)
    return torch.jit.optimize_for_inference(scripted)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit is deprecated
def test_torchscript_backend_on_toy_example():
    compiled = kiln_frontend.optimize(torchscript_backend)(toy_example)
    for i in range(6):
        a, b = torch.randn(10), torch.randn(10)
        b = b.abs() if i % 2 else -b.abs()
        torch.testing.assert_close(compiled(a, b), toy_example(a, b))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_backend_on_mlp():
    mlp = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()
    compiled = kiln_frontend.optimize(torchscript_backend)(mlp)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 16)
            torch.testing.assert_close(compiled(x), mlp(x))
