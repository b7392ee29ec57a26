"""Corpus: dynamic shapes (kiln_frontend/shapes.py).

Each case runs through ``check_case`` with its tensors' dimensions marked dynamic
(``mark_dynamic`` travels with the deep copies), then again under ``dynamic=True`` over
several input sizes: results must match eager and the sizes must not recompile."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import kiln_frontend
import pytest
import torch
import torch.nn.functional as F
from _harness import CountingBackend, assert_same, check_case
from kiln_frontend import eval_frame


def _marked(*shape, dims=None):
    t = torch.randn(*shape)
    kiln_frontend.mark_dynamic(t, list(range(t.dim())) if dims is None else dims)
    return t


@dataclasses.dataclass
class DynCase:
    fn: Callable
    shapes: list  # one tuple of input shapes per call; the first is the check_case input
    graphs: int = 1
    dims: list | None = None  # dims marked dynamic per input (None: all)

    @property
    def id(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def args(self, shapes):
        return tuple(_marked(*s, dims=None if self.dims is None else self.dims[i])
                     for i, s in enumerate(shapes))


def seed(x):
    y = x.sin()
    z = y.cos()
    return y, z


def view_by_size(x):
    return x.view(x.shape[0] * 2, -1) * 3


def size_method(x):
    return x.reshape(x.size(0), x.size(1) // 2, 2).sum(-1)


def branch_on_size(x):
    if x.shape[0] > 3:
        return x * 2
    return x - 1


def zeros_like_shape(x):
    return torch.zeros(x.shape[0], 2) + x[:, :2]


def slice_by_half(x):
    return x[:, : x.shape[1] // 2] * 2


def unpack_shape(x):
    b, n = x.shape
    return x.reshape(b * n) + b


def mean_by_numel(x):
    return x.sum() / x.numel()


def cat_flip(x):
    return torch.cat([x, x.flip(0)], 0)


def reshape_star(x):
    return x.reshape(*x.shape[:-1], 2, -1).mean(-1)


def arange_len(x):
    return torch.arange(x.shape[0]) * 1.0 + x[:, 0]


def expand_first_col(x):
    return x[:, :1].expand(-1, x.shape[1]) + x


def softmax_layernorm(x):
    return F.layer_norm(F.softmax(x, -1), x.shape[-1:])


def batched_matmul(x, w):
    return (x @ w).relu()


def flatten_transpose(x):
    return x.transpose(0, 1).contiguous().flatten(1)


def pad_last(x):
    return F.pad(x, (1, 1)) * 2


def returns_sizes(x):
    return x + 1, x.shape[0] * x.shape[1], x.size(-1)


def two_inputs_broadcast(x, y):
    return x * y.unsqueeze(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        return self.fc2(h).view(x.shape[0], -1)


#: three calls on one 2-d input whose sizes all change
_ROWS_4_6_5 = [[(4, 6)], [(6, 8)], [(5, 3)]]

CASES = [
    DynCase(seed, [[(3, 5)], [(7, 2)], [(4, 9)]]),
    DynCase(view_by_size, [[(3, 4)], [(5, 6)], [(6, 8)]]),
    DynCase(size_method, [[(3, 4)], [(5, 6)], [(2, 10)]]),
    DynCase(branch_on_size, [[(5, 3)], [(6, 4)], [(9, 2)]]),
    DynCase(zeros_like_shape, _ROWS_4_6_5),
    DynCase(slice_by_half, [[(4, 6)], [(6, 8)], [(5, 4)]]),
    DynCase(unpack_shape, _ROWS_4_6_5),
    DynCase(mean_by_numel, _ROWS_4_6_5),
    DynCase(cat_flip, _ROWS_4_6_5),
    DynCase(reshape_star, [[(3, 4)], [(5, 6)], [(2, 8)]]),
    DynCase(arange_len, _ROWS_4_6_5),
    DynCase(expand_first_col, _ROWS_4_6_5),
    DynCase(softmax_layernorm, _ROWS_4_6_5),
    DynCase(batched_matmul, [[(4, 6), (6, 5)], [(7, 6), (6, 5)], [(3, 6), (6, 5)]],
            dims=[[0], []]),
    DynCase(flatten_transpose, [[(4, 6, 5)], [(6, 8, 3)], [(5, 3, 2)]]),
    DynCase(pad_last, _ROWS_4_6_5),
    DynCase(returns_sizes, _ROWS_4_6_5),
    DynCase(two_inputs_broadcast, [[(4, 6), (6,)], [(5, 7), (7,)], [(3, 2), (2,)]],
            dims=[[0, 1], [0]]),
    DynCase(MLP(), [[(4, 6)], [(9, 6)], [(2, 6)]], dims=[[0]]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_dynamic_case_marked(case):
    """check_case on the first shapes, dims marked dynamic: equal to eager, one graph,
    symbolic sizes on the graph input, and the second call hits the cache."""
    result = check_case(case.fn, case.args(case.shapes[0]), case.graphs)
    ph = [n for n in result.graphs[0].graph.nodes if n.op == "placeholder"][0]
    assert any(isinstance(s, torch.SymInt) for s in ph.meta["example_value"].shape)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_dynamic_case_sizes_do_not_recompile(case):
    kiln_frontend.reset()
    backend = CountingBackend()
    fn = case.fn
    compiled = kiln_frontend.compile(fn, backend=backend, dynamic=True)
    for shapes in case.shapes:
        args = tuple(torch.randn(*s) for s in shapes)
        assert_same(compiled(*args), fn(*args), f"shapes {shapes}")
    assert len(backend.graphs) == case.graphs
    assert eval_frame.counters["recompiles"] == 0
    kiln_frontend.reset()
