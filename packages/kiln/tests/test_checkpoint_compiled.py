"""Activation checkpointing compiled (fullgraph=True): the region's body is one graph with the
rest of the frame, outputs and gradients equal eager's (C++ codegen), and the partitioner
recomputes the region in the backward (matmuls too) instead of saving its activations;
a selective policy's MUST_SAVE ops stay saved; random ops keep the forward's values."""

from __future__ import annotations

import functools

import kiln
import kiln_aotgrad
import kiln_frontend
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _nets import GeluMLP
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

pytestmark = pytest.mark.usefixtures("needs_cpp")


class Model(nn.Module):
    """Two checkpointed MLPs (``mode``: None = no checkpoint, "reentrant", "plain", "mm":
    selective, saving matmuls), then a head."""

    def __init__(self, mode):
        super().__init__()
        self.blocks = nn.ModuleList([GeluMLP(32, 128), GeluMLP(32, 128)])
        self.mode = mode

    def forward(self, x):
        for b in self.blocks:
            if self.mode is None:
                x = x + b(x)
            elif self.mode == "reentrant":
                x = x + checkpoint(b, x, use_reentrant=True)
            elif self.mode == "plain":
                x = x + checkpoint(b, x, use_reentrant=False)
            else:
                ctx = functools.partial(create_selective_checkpoint_contexts, _save_mm)
                x = x + checkpoint(b, x, use_reentrant=False, context_fn=ctx)
        return x.square().mean()


def _save_mm(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _run(mode, seed=0):
    """Compiled and eager losses and grads, and kiln's stats."""
    torch.manual_seed(seed)
    model = Model(mode)
    ref = Model(mode)
    ref.load_state_dict(model.state_dict())
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True)
    x = torch.randn(16, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    loss = compiled(x)
    loss.backward()
    ref_loss = ref(x2)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(x.grad, x2.grad)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    return kiln.stats()


@pytest.mark.parametrize("mode", ["plain", "reentrant", "mm"])
def test_checkpointed_blocks_compile_in_one_graph_as_eager(mode):
    stats = _run(mode)
    assert stats.training_graphs == 1
    assert stats.eager_fallbacks == 0
    assert kiln_frontend.eval_frame.counters["compiles"] == 1  # no graph break


def test_checkpointing_saves_fewer_bytes():
    plain = _run(None).saved_bytes
    checkpointed = _run("plain").saved_bytes
    reentrant = _run("reentrant").saved_bytes
    assert checkpointed < plain
    assert reentrant == checkpointed
    # saving the matmuls keeps more alive than plain checkpointing
    assert _run("mm").saved_bytes > checkpointed


def _partition(mode):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch.manual_seed(0)
    model = Model(mode)
    kiln_frontend.reset()
    kiln_frontend.compile(model, backend=capture, fullgraph=True)(
        torch.randn(16, 32, requires_grad=True))
    (gm, inputs), = graphs
    return kiln_aotgrad.partition(kiln_aotgrad.trace_joint(gm, inputs))


def _targets(part, names):
    """The ops of saved forward values."""
    nodes = {n.name: n for n in part.fw_gm.graph.nodes}
    return {str(nodes[n].target) for n in names if n in nodes and nodes[n].op == "call_function"}


def test_partition_recomputes_matmuls_of_plain_regions_and_saves_them_under_a_policy():
    plain = _partition("plain")
    recomputed = {str(n.target) for n in plain.bw_gm.graph.nodes
                  if n.name in plain.recomputed}
    assert recomputed & {"aten.mm.default", "aten.addmm.default"}, plain.report()
    saved = _targets(plain, plain.saved_names)
    assert not saved & {"aten.mm.default", "aten.addmm.default"}, plain.report()

    selective = _partition("mm")
    saved = _targets(selective, selective.saved_names)
    assert saved & {"aten.mm.default", "aten.addmm.default"}, selective.report()
    recomputed = {str(n.target) for n in selective.bw_gm.graph.nodes
                  if n.name in selective.recomputed}
    assert not recomputed & {"aten.mm.default", "aten.addmm.default"}, selective.report()


def test_dropout_inside_a_region_keeps_the_forward_mask():
    """Random ops are saved, never recomputed: the backward's mask is the forward's."""
    kiln.reset()

    def f(x):
        return checkpoint(lambda y: F.dropout(y.sin(), 0.5, training=True) * 3, x,
                          use_reentrant=False)

    compiled = kiln.compile(f, fullgraph=True)
    x = torch.randn(256, requires_grad=True)
    out = compiled(x)
    out.backward(torch.ones_like(out))
    kept = out != 0
    expected = torch.where(kept, 2 * 3 * x.detach().cos(), torch.zeros_like(x))
    torch.testing.assert_close(x.grad, expected)
    assert 0 < kept.sum() < 256


def test_transformer_layer_checkpointed():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    ref.load_state_dict(layer.state_dict())

    def f(mod, x):
        return checkpoint(mod, x, use_reentrant=False).square().sum()

    kiln.reset()
    compiled = kiln.compile(f, fullgraph=True)
    x = torch.randn(2, 6, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = compiled(layer, x)
    out.backward()
    expected = f(ref, x2)
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x2.grad)
    for (name, p), q in zip(layer.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert kiln.stats().training_graphs == 1


class AttentionLM(nn.Module):
    """Checkpointed attention blocks (SDPA, no dropout) and a cross-entropy head: the shape
    of a checkpointed GPT-2 step."""

    def __init__(self, d=32, vocab=512, layers=3):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.mlp = nn.ModuleList(GeluMLP(d, 4 * d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def block(self, i, x):
        b, s, d = x.shape
        q, k, v = self.qkv[i](x).view(b, s, 3, 2, d // 2).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + y.transpose(1, 2).reshape(b, s, d)
        return x + self.mlp[i](x)

    def forward(self, x, labels):
        for i in range(len(self.qkv)):
            x = checkpoint(self.block, i, x, use_reentrant=False)
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _kept_by_forward(fn) -> int:
    """Bytes the CPU allocator holds when ``fn()`` returns that it allocated (what the step
    keeps for the backward, with the loss)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    kept = sum(e.nbytes() for e in prof.profiler.kineto_results.events()
               if e.name() == "[memory]")
    return kept, out


def test_compiled_checkpointed_step_keeps_no_more_than_eager():
    """The compiled forward keeps at most eager's bytes for the backward (eager keeps each
    block's input and the log-softmax): not the NLL's one-hot, SDPA outputs inside regions,
    or a second copy of the logits (the partitioner's memory rules, test_partition_memory).
    Gradients equal eager's."""
    torch.manual_seed(0)
    model = AttentionLM()
    ref = AttentionLM()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(4, 64, 32, requires_grad=True)
    labels = torch.randint(0, 512, (4, 64))
    kiln.reset()
    compiled = kiln.compile(model, fullgraph=True)
    compiled(x, labels).backward()  # compile, and a first step
    model.zero_grad(set_to_none=True)
    x.grad = None
    kept_eager, ref_loss = _kept_by_forward(lambda: ref(x, labels))
    kept_kiln, loss = _kept_by_forward(lambda: compiled(x, labels))
    assert kept_kiln <= kept_eager, (kept_kiln, kept_eager)
    loss.backward()
    grad_x = x.grad
    x.grad = None
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad_x, x.grad)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
