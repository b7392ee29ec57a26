"""The wrapper binds static views of graph constants (a Linear's transposed weight under
``mm``) once, when it is loaded, instead of making them again at every call; the views share
the constants' storage, so a weight written in place after compile is still seen."""

from __future__ import annotations

import kiln_aotgrad
import kiln_loopir as K
import kiln_runtime
import pytest
import torch
import torch.nn as nn
from kiln_codegen_cpp.codegen import CppCodegen
from kiln_loopir.wrapper import CONSTANT_VIEWS_HEADER


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32, bias=False)
        self.b = nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(autouse=True)
def _unpacked(monkeypatch):
    """Views of the weights themselves (``mm``), not weights packed for MKL (a copy: guarded,
    ``packages/codegen-cpp/tests/test_packed_linear.py``)."""
    from kiln_loopir.lowerings import extern

    monkeypatch.setattr(extern, "PACKED_LINEAR", False)


def _compiled(model, x):
    with torch.no_grad():
        graph = K.lower(kiln_aotgrad.trace_inference(model, [x]), [x])
    module = K.generate_wrapper(K.schedule(graph), CppCodegen())
    return module, kiln_runtime.load(module)


def test_constant_views_are_bound_at_load_and_match_eager():
    torch.manual_seed(0)
    model, x = TwoLinears().eval(), torch.randn(4, 16)
    module, compiled = _compiled(model, x)
    source = module.wrapper_source
    call_body = source.split("def call(args):")[1].split(CONSTANT_VIEWS_HEADER)[0]
    assert CONSTANT_VIEWS_HEADER in source
    assert "reinterpret_tensor(const" not in call_body  # no constant view made per call
    assert source.count("_view") >= 4  # two bound, two used
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x), rtol=1e-5, atol=1e-5)
    # output_code.py puts the views after the constants they view
    code = module.meta["output_code"]
    assert code.index(CONSTANT_VIEWS_HEADER) > code.index("graph constants")


def test_a_weight_written_in_place_after_load_is_seen():
    torch.manual_seed(0)
    model, x = TwoLinears().eval(), torch.randn(4, 16)
    _, compiled = _compiled(model, x)
    with torch.no_grad():
        before = compiled(x)[0].clone()
        model.a.weight.mul_(-1.0)
        model.b.weight.add_(0.25)
        after = compiled(x)[0]
        torch.testing.assert_close(after, model(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, after)
