"""State a compiling backend bakes in must still be seen: the full kiln stack, not an eager
backend, because an eager backend re-runs each leaf module at call time and so hides what a
compiler freezes (module hooks, channels-last weight copies, BatchNorm folded into a conv)."""

from __future__ import annotations

import kiln
import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    yield
    kiln.reset()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()


def _double(module, inputs, output):
    return output * 2


MUTATIONS = {
    "weight_of_a_plain_conv_in_place": lambda m: m[3].weight.add_(1.0),
    "weight_of_a_folded_conv_in_place": lambda m: m[0].weight.mul_(2.0),
    "batchnorm_running_var_in_place": lambda m: m[1].running_var.add_(1.0),
    "batchnorm_weight_replaced": lambda m: setattr(m[1], "weight", nn.Parameter(torch.rand(8))),
    "forward_hook_added_to_a_leaf": lambda m: m[1].register_forward_hook(_double),
    "forward_pre_hook_added_to_a_leaf": lambda m: m[2].register_forward_pre_hook(
        lambda mod, args: (args[0] - 1,)),
    "batchnorm_switched_to_train": lambda m: m[1].train(),
}


@pytest.mark.parametrize("mutate", list(MUTATIONS.values()), ids=list(MUTATIONS))
def test_state_changed_after_compile_is_seen(mutate):
    model = _net()
    compiled = kiln.compile(model)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        mutate(model)
        expected = model(x)
        if model[1].training:  # a train-mode BatchNorm updates its stats: run both from one state
            model[1].running_mean.zero_()
            model[1].running_var.fill_(1.0)
            expected = model(x)
            model[1].running_mean.zero_()
            model[1].running_var.fill_(1.0)
        torch.testing.assert_close(compiled(x), expected)


def test_weight_written_in_place_after_a_graph_cache_hit_is_seen(monkeypatch):
    """A hit of the graph-level cache remakes the channels-last weight copies from the live
    weights; an in-place write after the hit must still be seen."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1")
    from kiln import cache

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()  # no fold
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
        cache.flush()
        kiln.reset()
        compiled = kiln.compile(model)
        torch.testing.assert_close(compiled(x), model(x))
        assert kiln.stats().graph_cache_hits >= 1
        model[2].weight.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x))
