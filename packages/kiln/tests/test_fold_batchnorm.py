"""kiln.passes.fold_conv_batchnorm: eval BatchNorm folded into the conv before it, guarded by
the parameters' version counters (a parameter written in place compiles again)."""

from __future__ import annotations

import kiln
import kiln_frontend
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln.passes import fold_conv_batchnorm


class ConvBn(nn.Module):
    def __init__(self, functional: bool = False, conv_bias: bool = False):
        super().__init__()
        self.functional = functional
        self.conv = nn.Conv2d(4, 6, 3, padding=1, bias=conv_bias)
        self.bn = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, 1)
        with torch.no_grad():  # statistics away from their init, so a wrong fold shows
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = self.conv(x)
        if self.functional:
            bn = self.bn
            y = F.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                             0.1, bn.eps)
        else:
            y = self.bn(y)
        return torch.relu(y) + self.conv2(y)


@pytest.mark.parametrize("functional", [False, True])
@pytest.mark.parametrize("conv_bias", [False, True])
def test_fold_matches_eager_and_removes_the_norm(functional, conv_bias):
    model = ConvBn(functional, conv_bias).eval()
    gm = torch.fx.symbolic_trace(model)
    folded, guard = fold_conv_batchnorm(gm)
    assert guard.folded == 1 and folded is not gm
    targets = [n.target for n in folded.graph.nodes]
    assert torch.conv2d in targets and "bn" not in targets and F.batch_norm not in targets
    assert "bn" in [n.target for n in gm.graph.nodes if n.op == "call_module"] or functional
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)


def test_training_mode_and_shared_conv_do_not_fold():
    model = ConvBn().train()
    _, guard = fold_conv_batchnorm(torch.fx.symbolic_trace(model))
    assert guard.folded == 0

    class Shared(ConvBn):
        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the conv's output is needed unnormalized too

    gm = torch.fx.symbolic_trace(Shared().eval())
    folded, guard = fold_conv_batchnorm(gm)
    assert guard.folded == 0 and folded is gm


def test_compiled_model_recompiles_when_a_folded_parameter_changes():
    kiln_frontend.reset()
    model = ConvBn().eval()
    compiled = kiln.compile(model)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        before = kiln.stats().graphs_compiled
        model.bn.running_var.mul_(3.0)  # in place, as load_state_dict does
        model.conv.weight.add_(0.5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert kiln.stats().graphs_compiled == before + 1
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert kiln.stats().graphs_compiled == before + 1  # the new graph is guarded afresh
        model.train()  # a BatchNorm leaving eval mode never runs the folded graph
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


class ConvBnInPlaceRelu(nn.Module):
    """timm's ResNet block: the activation writes the norm's output in place, and the next
    layer reads that tensor through the name the frame already had."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.body = ConvBn()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.body.bn(self.body.conv(x))
        if self.how == "module":
            self.act(y)
        elif self.how == "method":
            y.relu_()
        elif self.how == "functional":
            F.relu(y, inplace=True)
        else:
            torch.clamp(y, min=0, out=y)
        return self.body.conv2(y)


@pytest.mark.parametrize("how", ["module", "method", "functional", "out"])
def test_an_in_place_write_after_the_fold_is_kept(how):
    """The captured graph's in-place node has no users (the frame reads y itself); the fold's
    dead-code pass dropped it, so the ReLU vanished (resnet18 through kiln.compile: every
    output wrong)."""
    model = ConvBnInPlaceRelu(how).eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = model(x)
        kiln_frontend.reset()
        got = kiln.compile(model)(x)
    kiln_frontend.reset()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_folding_outside_a_frontend_compile_leaves_the_heap_unfrozen(monkeypatch):
    """On CPython 3.12 the frozen count is never 0 (the collector moves immortal objects to the
    permanent generation): a fold run outside the frontend's freeze (a hand-traced graph, as
    here) must not take that count for a frozen heap and freeze the whole heap for good."""
    import gc

    model = ConvBn(functional=True).eval()
    gm = torch.fx.symbolic_trace(model)
    calls = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 375)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    folded, guard = fold_conv_batchnorm(gm)
    monkeypatch.undo()
    assert guard.folded == 1 and calls == []
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)
