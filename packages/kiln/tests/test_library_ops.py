"""A model calling another library's operator (``torch.library.custom_op``, as transformers'
Mixtral does) compiles whole: the op runs as an extern call inside the generated code, not as
a failed compile that runs the frame eagerly (benchmarks/model_sweep.py found it)."""

from __future__ import annotations

import warnings

import kiln
import kiln_frontend
import torch
from kiln_frontend.logging_utils import KilnWarning


@torch.library.custom_op("kiln_test::row_cumsum", mutates_args=())
def row_cumsum(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.cumsum(x, dim=-1) * scale


@row_cumsum.register_fake
def _(x, scale):
    return torch.empty_like(x)


def f(x):
    return torch.relu(row_cumsum(x.sin(), 2.0)) + x.cos()


def test_library_op_compiles_inside_the_graph(needs_cpp):
    kiln_frontend.reset()
    x = torch.randn(4, 8)
    before = kiln.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # no "ran eagerly" warning
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
    after = kiln.stats()
    assert after.graphs_compiled == before.graphs_compiled + 1
    assert after.eager_fallbacks == before.eager_fallbacks
    assert after.aten_fallbacks.get("kiln_test::row_cumsum.default", 0) == \
        before.aten_fallbacks.get("kiln_test::row_cumsum.default", 0) + 1
