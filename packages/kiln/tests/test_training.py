"""kiln's training path: the kiln and aot_eager backends on graphs that need autograd, the
options, kiln.stats() and the debug folder. Every test compares with eager."""

from __future__ import annotations

import copy
import importlib.metadata

import kiln
import kiln_frontend
import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from _nets import NormMLP, compile_and_step
from kiln.backend import aot_eager_backend, kiln_backend


def Net():
    return NormMLP(8, 16, 4, norm=nn.BatchNorm1d)


def _train_compare(backend, options=None):
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(6, 8)
    compiled = backend(gm, [x], options=options) if options else backend(gm, [x])
    for _ in range(2):
        x = torch.randn(6, 8)
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
        for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    torch.testing.assert_close(model.norm.running_var, ref.norm.running_var)
    return compiled


def test_aot_eager_backend_is_an_entry_point_and_matches_eager():
    names = {ep.name for ep in importlib.metadata.entry_points(group="kiln.backends")}
    assert "aot_eager" in names
    assert "aot_eager" in kiln_frontend.list_backends()
    _train_compare(aot_eager_backend)


def test_kiln_backend_compiles_forward_and_backward(needs_cpp):
    before = kiln.stats()
    _train_compare(kiln_backend)
    after = kiln.stats()
    assert after.forward_graphs_compiled == before.forward_graphs_compiled + 1
    assert after.backward_graphs_compiled == before.backward_graphs_compiled + 1
    assert after.training_graphs == before.training_graphs + 1
    assert after.saved_bytes > before.saved_bytes
    assert after.eager_fallbacks == before.eager_fallbacks
    assert "backward_graphs_compiled" in str(after)


@pytest.mark.parametrize(
    "options", [{"partitioner": "save_all"}, {"activation_memory_budget": 0.3}]
)
def test_partition_options_reach_the_partitioner(options, needs_cpp):
    compiled = _train_compare(kiln_backend, options)
    part = compiled.compiled.partition
    if "partitioner" in options:
        assert part.strategy == "save_all"
    else:
        assert part.strategy == "min_cut"


def test_bad_training_options_raise():
    with pytest.raises(ValueError, match="known partitioners: min_cut, save_all"):
        kiln.Options.from_user({"partitioner": "greedy"})
    with pytest.raises(ValueError, match="activation_memory_budget"):
        kiln.Options.from_user({"activation_memory_budget": 1.5})


def test_mutating_an_input_that_requires_grad_runs_eagerly(caplog):
    import logging

    def f(x, y):
        y.mul_(2)
        return (x * y).sum()

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, requires_grad=True)
    y = torch.randn(4, requires_grad=True).clone()  # a non-leaf: eager may mutate it
    with caplog.at_level(logging.INFO, logger="kiln"):
        compiled = aot_eager_backend(gm, [x, y])
    assert compiled == gm.forward
    assert any("requires grad" in r.getMessage() for r in caplog.records if r.name == "kiln")


def test_debug_folder_has_forward_backward_and_partition(tmp_path, monkeypatch, needs_cpp):
    monkeypatch.setenv("KILN_COMPILE_DEBUG", "1")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    monkeypatch.setattr("kiln.debug._run_dir", None)
    _train_compare(kiln_backend)
    (run,) = [p for p in tmp_path.iterdir() if p.name.startswith("run_")]
    (graph,) = sorted(p for p in run.iterdir() if p.name.startswith("graph_"))
    names = {p.name for p in graph.iterdir()}
    assert {
        "fx_graph.txt",
        "joint_graph.txt",
        "forward_graph.txt",
        "backward_graph.txt",
        "partition.txt",
        "forward",
        "backward",
    } <= names
    report = (graph / "partition.txt").read_text()
    assert "min_cut" in report and "save_all would save" in report and "bytes" in report
    assert (graph / "forward" / "output_code.py").exists()
    assert (graph / "backward" / "output_code.py").exists()


def test_frontend_grad_mode_guard_recompiles_for_no_grad(needs_cpp):
    kiln_frontend.reset()
    torch.manual_seed(0)
    model = Net()
    compiled, ref, x = compile_and_step(model)
    model.eval()
    ref.eval()
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, ref(x))
    kiln_frontend.reset()


def test_dynamic_batch_compiles_one_training_graph(needs_cpp):
    kiln_frontend.reset()
    kiln.reset_stats()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    class Wrapper(nn.Module):  # a user-level forward: the frontend skips torch's own code
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x):
            return self.net[2](self.net[1](self.net[0](x)))

    wrapper = Wrapper()
    ref = copy.deepcopy(wrapper)
    compiled = kiln.compile(wrapper, dynamic=True)
    for batch in (4, 6, 9):
        x = torch.randn(batch, 8)
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
        for (name, p), (_, q) in zip(
            wrapper.named_parameters(), ref.named_parameters(), strict=True
        ):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    s = kiln.stats()
    assert s.training_graphs == 1 and s.backward_graphs_compiled == 1
    assert s.eager_fallbacks == 0
    kiln_frontend.reset()


def test_attention_backward_kept_whole_is_an_extern_call(needs_cpp):
    # grouped-query attention keeps the fused attention backward in the joint graph (no
    # decomposition applies): loopir calls it as an extern, grads equal eager's
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) * 2

    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(2))
    before = kiln.stats()
    compiled = kiln_backend(torch.fx.symbolic_trace(attention), [q, k, v])
    cot = torch.randn(2, 4, 5, 8)
    got = torch.autograd.grad(compiled(q, k, v), [q, k, v], cot)
    want = torch.autograd.grad(attention(q, k, v), [q, k, v], cot)
    torch.testing.assert_close(got, want)
    after = kiln.stats()
    assert after.backward_graphs_compiled == before.backward_graphs_compiled + 1
    assert after.eager_fallbacks == before.eager_fallbacks
