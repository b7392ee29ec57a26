"""A product with a constant weight whose output row length the device's GEMM wants aligned
(``DeviceLibrary.gemm_out_align``: bf16/fp16 on CUDA, where cuBLAS runs an unaligned row
length, GPT-2's 50257-word LM head, on slow kernels) runs on the weight zero-padded once at
compile time, its result read back through a view. CPU has no such alignment, so these tests
give CPU float32 one for the duration (the lowering is the same for every device)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from kiln_loopir.lowerings import extern
from test_pipeline import run


@pytest.fixture
def cpu_wants_aligned_rows(monkeypatch):
    lib = extern.DEVICE_LIBRARIES["cpu"]
    monkeypatch.setitem(extern.DEVICE_LIBRARIES, "cpu",
                        dataclasses.replace(lib, gemm_out_align={torch.float32: 8}))
    monkeypatch.setattr(extern, "PACKED_LINEAR", False)


class _Head(nn.Module):
    """A tied LM head: ``h @ E.t()`` with 50 words (not a multiple of 8), then a softmax."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)

    def forward(self, ids):
        h = torch.tanh(self.embed(ids))
        logits = h @ self.embed.weight.t()
        return logits, logits.softmax(-1)


def test_unaligned_product_runs_on_a_padded_weight_and_matches_eager(cpu_wants_aligned_rows):
    torch.manual_seed(0)
    with torch.no_grad():
        compiled = run(_Head().eval(), torch.randint(0, 50, (3, 7)), rtol=1e-5, atol=1e-5)
    text = str(compiled.module.meta["schedule"])
    assert "pad_rows(" in text, text  # the derived constant prints its recipe


def test_aligned_or_unconfigured_products_are_left_alone(cpu_wants_aligned_rows, monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(16, 48, bias=False).eval()  # 48: already aligned
    with torch.no_grad():
        compiled = run(model, torch.randn(4, 16), rtol=1e-5, atol=1e-5)
    assert "pad_rows(" not in str(compiled.module.meta["schedule"])
    monkeypatch.setattr(extern, "PAD_GEMM_OUTPUTS", False)
    with torch.no_grad():
        compiled = run(_Head().eval(), torch.randint(0, 50, (3, 7)), rtol=1e-5, atol=1e-5)
    assert "pad_rows(" not in str(compiled.module.meta["schedule"])


def test_the_padded_weight_follows_in_place_writes(cpu_wants_aligned_rows):
    torch.manual_seed(0)
    model = _Head().eval()
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        compiled = run(model, ids, rtol=1e-5, atol=1e-5)
        model.embed.weight.mul_(-0.5)  # the padded copy is stale now
        for got, want in zip(compiled(ids), model(ids), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
