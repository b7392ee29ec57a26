"""A ``@torch.library.custom_op`` function called by its Python name (not through
``torch.ops``) goes into the graph as its operator: it graph-broke on "call to
UserDefinedObjectVariable(CustomOpDef)" before (benchmarks/model_sweep.py)."""

from __future__ import annotations

import torch
from _counting_backend import one_graph


@torch.library.custom_op("kiln_frontend_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_custom_op_def_call_is_one_graph_node():
    gm = one_graph(lambda x: twice(x.sin()) + 1, torch.randn(3, 4))
    assert torch.ops.kiln_frontend_test.twice.default in [n.target for n in gm.graph.nodes]
