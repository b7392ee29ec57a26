"""``torch.jit.script`` functions called from a compiled frame are traced through the Python
function TorchScript compiled (``_torchdynamo_inline``), as torch.compile does: one graph, no
break (transformers' DeBERTa-v2 calls six of them per layer)."""

from __future__ import annotations

import torch
from _counting_backend import CountingBackend, check_calls
from kiln_frontend import compile as kiln_compile


@torch.jit.script
def bucket(rel, mid: int):
    return torch.where(rel.abs() < mid, rel, torch.sign(rel) * mid)


@torch.jit.script
def scale_of(x: torch.Tensor, factor: int):
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * factor)


@torch.jit.script
def bucket_wide(rel, mid: int):
    return torch.where(rel.abs() < 2 * mid, rel, torch.sign(rel) * 2 * mid)


def test_script_functions_trace_into_one_graph():
    def f(x, rel):
        return x / scale_of(x, 2) + bucket(rel, 3).to(x.dtype)

    x, rel = torch.randn(2, 8), torch.arange(-8, 8).reshape(2, 8)
    check_calls(f, (x, rel), graphs=1, fullgraph=True)


def test_rebinding_a_script_function_recompiles():
    global bucket
    saved = bucket

    def f(rel):
        return bucket(rel, 3) + 1

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    rel = torch.arange(-8, 8)
    torch.testing.assert_close(compiled(rel), f(rel))
    try:
        bucket = bucket_wide
        torch.testing.assert_close(compiled(rel), f(rel))
    finally:
        bucket = saved
    assert len(backend.graphs) == 2
