"""Corpus: ``kiln_frontend.explain`` on programs with and without graph breaks.

Each case says how many graphs and breaks explain must report, a phrase of each break
reason, and the line (relative to the function's ``def``) each break points at; the same
program also runs through ``check_case`` (results equal eager, same graph count)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import kiln_frontend
import pytest
import torch
from _harness import check_case


@dataclasses.dataclass
class ExplainCase:
    fn: Callable
    args: tuple
    graphs: int
    #: (phrase in the reason, line offset from the def line) per break
    breaks: list[tuple[str, int]]
    ops: list[list[str]] | None = None

    @property
    def id(self) -> str:
        return self.fn.__name__


def no_break(x, y):
    return torch.relu(x) @ y


def data_dependent_if(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def print_in_middle(x):
    y = x.cos()
    print("", end="")
    return y.sin()


def item_call(x):
    y = x.abs()
    n = y.sum().item()
    return y * n


def _inner_helper(x):
    return x.mean().tolist()


def break_in_helper(x):
    y = x + 1
    m = _inner_helper(y)
    return y - m


def numpy_call(x):
    y = x.exp()
    z = y.numpy()
    return torch.from_numpy(z) + 1


def two_breaks(x):
    y = x + 1
    print("", end="")
    y = y * 2
    print("", end="")
    return y - 3


def loop_with_print(x):
    for _ in range(2):
        print("", end="")
        x = x + 1
    return x


def nonzero_op(x):
    y = x * 2
    idx = torch.nonzero(y > 0)
    return idx.float().sum() + y.sum()


CASES = [
    ExplainCase(no_break, (torch.randn(2, 3), torch.randn(3, 2)), 1, [],
                [["torch.relu", "operator.matmul"]]),
    ExplainCase(data_dependent_if, (torch.ones(3),), 2,
                [("data-dependent branch on a tensor", 2)],
                [["operator.mul", "Tensor.sum", "operator.gt"], ["operator.add"]]),
    ExplainCase(print_in_middle, (torch.randn(3),), 2, [("print", 2)],
                [["Tensor.cos"], ["Tensor.sin"]]),
    # .item() breaks (captured under fullgraph or config.capture_scalar_outputs)
    ExplainCase(item_call, (torch.randn(3),), 2, [("item()", 2)]),
    # the call breaks in break_in_helper; then _inner_helper's own frame is captured and
    # breaks at the same line: 3 graphs (before the call, the mean, after the call)
    ExplainCase(break_in_helper, (torch.randn(3),), 3, [("tolist()", -3), ("tolist()", -3)]),
    # NumPy is traced into the graph (torch._numpy, issue 10): no break
    ExplainCase(numpy_call, (torch.randn(3),), 1, []),
    ExplainCase(two_breaks, (torch.randn(3),), 3, [("print", 2), ("print", 4)]),
    ExplainCase(loop_with_print, (torch.randn(3),), 0, [("print", 2)]),
    ExplainCase(nonzero_op, (torch.randn(4),), 1, []),  # an unbacked size (issue 10)
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explain_case(case):
    out = kiln_frontend.explain(case.fn)(*case.args)
    assert out.graph_count == case.graphs, str(out)
    assert out.graph_break_count == len(case.breaks), str(out)
    first = case.fn.__code__.co_firstlineno
    for brk, (phrase, offset) in zip(out.break_reasons, case.breaks, strict=True):
        assert phrase in brk.reason, str(out)
        assert brk.filename == __file__
        assert brk.lineno == first + offset, str(out)
        assert f"{__file__}:{brk.lineno}" in str(out)
    if case.ops is not None:
        assert out.ops_per_graph == case.ops
    assert out.op_count == sum(len(o) for o in out.ops_per_graph)
    text = str(out)
    assert f"Graph Count: {case.graphs}\nGraph Break Count: {len(case.breaks)}\n" in text
    if case.graphs:
        assert "Out Guards:" in text and "GRAD_MODE" in text


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explained_program_runs_like_eager(case):
    check_case(case.fn, case.args, case.graphs)
