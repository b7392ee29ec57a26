"""Sparse tensors (COO, CSR, ...) are never captured: they have no strides, so neither fake
tensors, guards nor a backend can hold them.  An input, attribute or op result that is sparse
is a clean graph break (the op runs eagerly), as torch.compile breaks ("does not support
sparse Tensors"); with ``fullgraph=True`` it is an ``Unsupported`` naming the tensor.  Never
an internal error of kiln."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset
from kiln_frontend.exc import Unsupported

LAYOUTS = {
    "coo": lambda t: t.to_sparse(),
    "csr": lambda t: t.to_sparse_csr(),
}


@pytest.fixture(autouse=True)
def _fresh():
    reset()
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    yield
    reset()


def _dense(x):
    return x.to_dense() if isinstance(x, torch.Tensor) and x.layout != torch.strided else x


def _strided_only(backend: CountingBackend) -> None:
    for gm, inputs in zip(backend.graphs, backend.example_inputs, strict=True):
        for x in inputs:
            if isinstance(x, torch.Tensor):
                assert x.layout == torch.strided, gm.code
        for node in gm.graph.nodes:
            ex = node.meta.get("example_value")
            if isinstance(ex, torch.Tensor):
                assert ex.layout == torch.strided, (node.format_node(), gm.code)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sparse_input_is_a_graph_break_not_an_internal_error(layout, caplog):
    def f(s, y):
        z = y * 2  # captured before the break
        return torch.mm(s, z) + 1

    s = LAYOUTS[layout](torch.randn(4, 4).relu())
    y = torch.randn(4, 3)
    backend = CountingBackend()
    with caplog.at_level(logging.DEBUG):
        out = kiln_compile(f, backend=backend)(s, y)
    torch.testing.assert_close(out, f(s, y))
    assert backend.graphs, "the dense work before the sparse op is still captured"
    _strided_only(backend)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sparse_input_under_fullgraph_names_the_input(layout):
    s = LAYOUTS[layout](torch.randn(4, 4).relu())
    with pytest.raises(Unsupported, match=rf"L\['s'\] is a sparse_{layout} tensor"):
        kiln_compile(lambda s, y: torch.mm(s, y), backend=CountingBackend(),
                     fullgraph=True)(s, torch.randn(4, 3))


def test_sparse_result_is_a_graph_break():
    def f(y):
        return (y * 2).to_sparse().to_dense() + 1

    y = torch.randn(3, 4)
    backend = CountingBackend()
    torch.testing.assert_close(kiln_compile(f, backend=backend)(y), f(y))
    assert backend.graphs
    _strided_only(backend)
    reset()
    with pytest.raises(Unsupported, match="the result of Tensor.to_sparse is a sparse_coo"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(y)


def test_sparse_module_buffer_is_a_graph_break():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("adj", torch.eye(4).to_sparse())

        def forward(self, x):
            return torch.sparse.mm(self.adj, x).relu()

    m, x = M(), torch.randn(4, 2)
    backend = CountingBackend()
    torch.testing.assert_close(_dense(kiln_compile(m, backend=backend)(x)), m(x))
    _strided_only(backend)


def test_dense_and_sparse_calls_of_one_frame_each_get_their_own_code():
    """Guards keep the layouts apart: a frame compiled for a dense input is not reused for a
    sparse one (nor the reverse), and no guard check fails on a tensor without strides."""

    def f(s, y):
        return torch.mm(s, y * 2) + 1

    d, y = torch.randn(4, 4).relu(), torch.randn(4, 3)
    compiled = kiln_compile(f, backend=CountingBackend())
    for s in (d.to_sparse(), d.to_sparse_csr(), d, d.to_sparse(), d):
        torch.testing.assert_close(compiled(s, y), f(s, y))
