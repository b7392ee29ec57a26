"""CORE_OPS, the decomposition table and docs/ops.md agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kiln_aotgrad import CORE_OPS, KEEP, core_decompositions
from kiln_aotgrad.core_ops import CORE_OP_GROUPS, DEVICE_KEPT_OPS
from kiln_aotgrad.ops_doc import render

DOC = Path(__file__).resolve().parents[3] / "docs" / "ops.md"


def test_docs_ops_md_is_generated_from_core_ops():
    if not DOC.exists():
        pytest.skip("docs/ops.md is not beside this checkout")
    assert DOC.read_text() == render(), (
        "docs/ops.md is stale: run `python -m kiln_aotgrad.ops_doc docs/ops.md`"
    )


def test_doc_lists_exactly_core_ops():
    text = render()
    listed = {
        line.strip()[len("- `aten.") : -1]
        for line in text.splitlines()
        if line.startswith("- `aten.")
    }
    assert listed == {n for _, names in CORE_OP_GROUPS.values() for n in names}
    assert {op.__name__ for op in CORE_OPS} <= listed


def test_no_core_op_is_decomposed():
    table = core_decompositions()
    assert not [op for op in CORE_OPS
                if op in table and op not in _SIZE_QUERIES and op not in DEVICE_KEPT_OPS]


def test_variance_is_kept_whole_on_cuda_only():
    # loopir's Welford reductions on CUDA; two vectorizable sums on CPU
    from torch._subclasses.fake_tensor import FakeTensorMode

    table = core_decompositions()
    variance = [torch.ops.aten.var.correction, torch.ops.aten.var_mean.correction,
                torch.ops.aten.std.correction]
    assert set(variance) <= DEVICE_KEPT_OPS
    with FakeTensorMode():
        for device in ("cuda", "cpu"):
            x = torch.empty(4, 8, device=device)
            for op in variance:
                out = table[op](x, [1], correction=0, keepdim=True)
                assert (out is NotImplemented) == (device == "cuda"), (op, device)


def test_embedding_backward_is_kept_whole_on_cpu_only():
    # eager's CPU kernel against one atomic add per element in a scatter kernel (BERT's
    # token-type table: every token into one row); other devices (meta tensors stand for
    # them: this torch may have no CUDA) keep torch's decomposition
    op = torch.ops.aten.embedding_dense_backward.default
    assert op in DEVICE_KEPT_OPS
    table = core_decompositions()
    for device in ("meta", "cpu"):
        grad = torch.zeros(2, 5, 8, device=device)
        indices = torch.zeros(2, 5, dtype=torch.long, device=device)
        out = table[op](grad, indices, 10, -1, False)
        assert (out is NotImplemented) == (device == "cpu"), device
        if device == "meta":
            assert out.shape == (10, 8)


_SIZE_QUERIES = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int}


def test_kept_ops_are_core_and_not_decomposed():
    table = core_decompositions()
    for op in KEEP:
        assert op in CORE_OPS
        assert op not in table


def test_every_torch_core_op_is_kept_or_decomposed():
    """A new torch release that tags more ops `core` shows up here."""
    if torch.__version__ < "2.13":
        pytest.skip("CORE_OPS was drawn up against torch 2.13's core tags")
    table = core_decompositions()
    aten = torch.ops.aten
    missing = []
    for name in dir(aten):
        packet = getattr(aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core not in op.tags or "out" in overload:
                continue
            if op not in CORE_OPS and op not in table:
                missing.append(str(op))
    assert missing == []


def test_groups_have_no_duplicates():
    names = [n for _, ops in CORE_OP_GROUPS.values() for n in ops]
    assert len(names) == len(set(names))
