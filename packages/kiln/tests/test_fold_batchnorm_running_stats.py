"""Folded BatchNorms stay right after a training-mode forward between calls (found by
benchmarks/model_sweep.py on timm resnet18): BatchNorm in training mode writes its running
statistics in place without bumping their version counters, so the version guard of the
folded weights saw nothing and the compiled model kept the statistics of compile time. The
guard now also watches the module's ``num_batches_tracked`` (bumped by every training-mode
forward), both after a compile and on a graph-cache hit; statistics no such module owns are
not folded."""

from __future__ import annotations

import kiln
import kiln.cache
import kiln_frontend
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln.backend import kiln_backend
from kiln.passes import fold_conv_batchnorm


class FunctionalBN(nn.BatchNorm2d):
    """timm's BatchNormAct2d in miniature: a BatchNorm2d subclass calling F.batch_norm (the
    frontend inlines it: a functional batch_norm on get_attr statistics, no module in the
    graph)."""

    def forward(self, x):
        if self.training:
            self.num_batches_tracked.add_(1)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training, self.momentum, self.eps)


class ConvBn(nn.Module):
    def __init__(self, bn: type[nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = bn(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


X = torch.randn(2, 3, 8, 8)


def _train_step_then_eval_matches(model: nn.Module, compiled) -> None:
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), model(X))
        model.train()
        model(X * 3 + 1)  # eager, training mode: the running statistics move (no version bump)
        model.eval()
        torch.testing.assert_close(compiled(X), model(X))


@pytest.mark.parametrize("bn", [nn.BatchNorm2d, FunctionalBN], ids=["module", "functional"])
def test_compiled_model_sees_statistics_a_training_forward_changed(bn, needs_cpp):
    kiln_frontend.reset()
    torch.manual_seed(0)
    model = ConvBn(bn).eval()
    _train_step_then_eval_matches(model, kiln.compile(model))


def test_statistics_no_module_tracks_are_not_folded():
    class Plain(nn.Module):  # running statistics with no num_batches_tracked beside them
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.register_buffer("mean", torch.zeros(4))
            self.register_buffer("var", torch.ones(4))

        def forward(self, x):
            return F.batch_norm(self.conv(x), self.mean, self.var, None, None, False, 0.1, 1e-5)

    _, guard = fold_conv_batchnorm(torch.fx.symbolic_trace(Plain().eval()))
    assert guard.folded == 0
    model = ConvBn().eval()
    _, guard = fold_conv_batchnorm(torch.fx.symbolic_trace(model))
    assert guard.folded == 1
    assert any(t is model.bn.num_batches_tracked for t, _ in guard.sources)


def test_graph_cache_hit_sees_statistics_a_training_forward_changed(tmp_path, monkeypatch,
                                                                      needs_cpp):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    a, b = ConvBn().eval(), ConvBn().eval()
    with torch.no_grad():
        kiln_backend(torch.fx.symbolic_trace(a), [X])
        kiln.cache.flush()
        before = kiln.stats().graph_cache_hits
        compiled = kiln_backend(torch.fx.symbolic_trace(b), [X])
    assert kiln.stats().graph_cache_hits == before + 1
    _train_step_then_eval_matches(b, compiled)


def test_functional_batchnorm_folds_while_the_frontend_freezes_the_heap(caplog, needs_cpp):
    """The frontend freezes the heap while a frame compiles (kiln_frontend.collector), and
    ``gc.get_referrers`` skips frozen objects: the module owning a functional BatchNorm's
    statistics was never found, so timm's BatchNormAct2d never folded through kiln.compile."""
    import logging

    kiln_frontend.reset()
    torch.manual_seed(0)
    model = ConvBn(FunctionalBN).eval()
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        out = kiln.compile(model)(X)
        torch.testing.assert_close(out, model(X))
    assert "folded 1 conv+batchnorm" in caplog.text
    assert "not folded" not in caplog.text
    _train_step_then_eval_matches(model, kiln.compile(model))
