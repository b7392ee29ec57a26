"""What the partition keeps alive for the backward (issue 28 item 4): checkpoint regions
recompute SDPA (no dropout) instead of saving its output; a region's output that a later
region reads is saved, the last region's is recomputed; the backward recomputes a region
just before its own backward, not all regions first; tangent-free pieces of backward
formulas (NLL's one-hot) run in the backward; module tensors are free to save (a weight
rather than its bf16 cast), and an input is saved rather than a computed value of its size.
Gradients equal eager's throughout (graphs run with torch ops)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from kiln_aotgrad import compile_joint, partition, trace_joint
from kiln_aotgrad.checkpoint import DROPOUT_ARGUMENTS, _dropout_argument, draws_random
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 2, dropout: float = 0.0):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln = nn.LayerNorm(d)
        self.qkv, self.fc1, self.fc2 = nn.Linear(d, 3 * d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), dropout_p=self.dropout)
        x = x + y.transpose(1, 2).reshape(b, s, d)
        return x + self.fc2(F.gelu(self.fc1(x)))


class Blocks(nn.Module):
    def __init__(self, n: int = 4, d: int = 16, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(d, dropout=dropout) for _ in range(n))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x).square().mean()


def _checkpointed(model: nn.Module) -> torch.fx.GraphModule:
    """``model`` traced, each ``blocks.i``'s nodes tagged as torch.utils.checkpoint tags its
    region (``PREFER_RECOMPUTE``, region ``i + 1``)."""
    gm = torch.fx.symbolic_trace(model)
    for n in gm.graph.nodes:
        blocks = [k for k in n.meta.get("nn_module_stack") or {}
                  if k.startswith("blocks.") and k.count(".") == 1]
        if blocks:
            n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
            n.meta["ac_graph_id"] = int(blocks[0].split(".")[1]) + 1
    return gm


def _x(d: int = 16, tokens: tuple[int, int] = (2, 8)) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(*tokens, d, requires_grad=True)


def _same_grads_as_eager(model: nn.Module, gm: torch.fx.GraphModule, x: torch.Tensor):
    ref = copy.deepcopy(model)
    compiled = compile_joint(gm, [x])
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    torch.manual_seed(5)
    loss = compiled(x1)
    loss.backward()
    torch.manual_seed(5)
    want = ref(x2)
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(x1.grad, x2.grad)
    for (name, p), q in zip(gm.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    return compiled.compiled.partition


def _saved_nodes(part, joint):
    nodes = {n.name: n for n in joint.gm.graph.nodes}
    return [nodes[name] for name in part.saved_names]


def _bytes(node: torch.fx.Node) -> int:
    v = node.meta.get("val")
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def _is_view(node: torch.fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and bool(t._schema.returns) and \
        t._schema.returns[0].alias_info is not None and not t._schema.is_mutable


def _peak_live_bytes(gm: torch.fx.GraphModule) -> int:
    """The most bytes of values ``gm`` computes that are alive at once, each freed after its
    last use (a view keeps its base alive), as the wrapper's memory plan frees them."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    root = {}
    for n in nodes:
        base = n.args[0] if _is_view(n) and isinstance(n.args[0], torch.fx.Node) else None
        root[n] = root.get(base, base) if base in root else (base if base is not None and
                                                            base.op != "placeholder" else n)
        if base is not None and base.op == "placeholder":
            root[n] = None  # a view of an input: allocates nothing
    last = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            if root.get(a) is not None:
                last[root[a]] = i
    live, peak = {}, 0
    for i, n in enumerate(nodes):
        if root[n] is n:
            live[n] = _bytes(n)
        peak = max(peak, sum(live.values()))
        for r in [r for r in live if last.get(r, -1) <= i]:
            del live[r]
    return peak


def test_sdpa_without_dropout_is_recomputed_in_a_region():
    """torch tags the SDPA kernels random (for their dropout); with dropout_p 0 they draw
    nothing, so a region recomputes them like its matmuls instead of saving their output."""
    model = Blocks(n=2)
    gm = _checkpointed(model)
    part = _same_grads_as_eager(model, gm, _x())
    joint = trace_joint(gm, [_x()])
    saved = _saved_nodes(partition(joint), joint)
    sdpa = [n for n in saved if n.target is SDPA or
            (n.target is operator.getitem and n.args[0].target is SDPA)]
    assert sdpa == [], [n.format_node() for n in sdpa]
    recomputed_ops = {n.target for n in part.bw_gm.graph.nodes if n.name in part.recomputed}
    assert SDPA in recomputed_ops and aten.addmm.default in recomputed_ops


def test_sdpa_draws_random_only_with_dropout():
    """An SDPA kernel is random (saved, never recomputed) when its dropout_p is not 0,
    positional or keyword; other random ops always are."""
    g = torch.fx.Graph()
    q, k, v = (g.placeholder(name) for name in "qkv")
    assert not draws_random(g.call_function(SDPA, (q, k, v)))
    assert not draws_random(g.call_function(SDPA, (q, k, v, 0.0)))
    assert draws_random(g.call_function(SDPA, (q, k, v, 0.3)))
    assert draws_random(g.call_function(SDPA, (q, k, v), {"dropout_p": 0.3}))
    assert draws_random(g.call_function(aten.bernoulli.p, (q, 0.0)))
    assert not draws_random(g.call_function(aten.add.Tensor, (q, k)))


def test_dropout_argument_registry_refuses_duplicates():
    assert DROPOUT_ARGUMENTS[aten._scaled_dot_product_flash_attention_for_cpu] == "dropout_p"
    with pytest.raises(ValueError, match="registered twice"):
        _dropout_argument(aten._scaled_dot_product_flash_attention_for_cpu, "dropout_p")


def test_region_boundaries_saved_and_last_region_recomputed():
    """Each block's output that the next block reads is saved (no recompute chaining back
    through the regions); the last block's output, read only by the final norm, is
    recomputed: computed values saved = n - 1 activations plus the norm's statistics."""
    n, d = 4, 16
    model = Blocks(n=n, d=d)
    gm = _checkpointed(model)
    _same_grads_as_eager(model, gm, _x(d))
    joint = trace_joint(gm, [_x(d)])
    saved = [s for s in _saved_nodes(partition(joint), joint) if s.op != "placeholder"]
    activation = 2 * 8 * d * 4
    big = [s for s in saved if _bytes(s) >= activation]
    assert len(big) == n - 1, [s.format_node() for s in big]
    assert sum(_bytes(s) for s in saved) < n * activation


def test_backward_recomputes_each_region_just_before_its_backward():
    """The backward graph's recomputation is interleaved with the gradients: the values a
    region recomputes are alive only around its own backward, so the backward of 6 blocks
    peaks where the backward of one block does (the joint graph's order puts every
    recomputation first: 3.7x one block's at these sizes)."""
    d, tokens = 16, (8, 32)  # activations outweigh the weights

    def backward_peak(n: int) -> tuple[int, nn.Module]:
        model = Blocks(n=n, d=d)
        gm = _checkpointed(model)
        part = partition(trace_joint(gm, [_x(d, tokens)]))
        return _peak_live_bytes(part.bw_gm), model

    one, _ = backward_peak(1)
    six, model = backward_peak(6)
    assert six < 1.2 * one, (six, one)
    _same_grads_as_eager(model, _checkpointed(model), _x(d, tokens))


def test_nll_one_hot_runs_in_the_backward_and_the_input_logits_are_saved():
    """cross_entropy's backward builds a one-hot ``scatter`` from the labels, which no forward
    output needs: it runs in the backward instead of being computed in the forward and saved;
    and the cut saves the graph's input (the logits, which the caller holds) rather than
    their log-softmax, a new value of the same size."""
    gm = torch.fx.symbolic_trace(lambda logits, labels: F.cross_entropy(logits, labels))
    base = torch.randn(64, 100, requires_grad=True)
    logits = base * 1  # an earlier graph's output: not a leaf
    labels = torch.randint(0, 100, (64,))
    joint = trace_joint(gm, [logits, labels])
    part = partition(joint)
    saved = _saved_nodes(part, joint)
    large = [s for s in saved if _bytes(s) >= 64 * 100 * 4]
    assert [s.name for s in large] == ["logits"], [s.format_node() for s in large]
    assert aten.scatter.value not in {n.target for n in part.fw_gm.graph.nodes}
    compiled = compile_joint(gm, [logits, labels])
    g1 = torch.autograd.grad(compiled(base * 1, labels), base)
    g2 = torch.autograd.grad(F.cross_entropy(base * 1, labels), base)
    torch.testing.assert_close(g1, g2)


def test_weights_saved_rather_than_their_autocast_copies():
    """Under bf16 autocast the matmuls read bf16 copies of the fp32 weights; the module holds
    the weights anyway, so saving a weight is free and its copy is recomputed in the
    backward instead of saved (as many bytes again, per weight, kept through the step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        joint = trace_joint(gm, [x])
        part = partition(joint)
    weight_shapes = {tuple(p.shape) for p in model.parameters()}
    computed = [s for s in _saved_nodes(part, joint) if s.op != "placeholder"]
    copies = [s for s in computed if tuple(s.meta["val"].shape) in weight_shapes or
              tuple(reversed(s.meta["val"].shape)) in weight_shapes]
    assert copies == [], [s.format_node() for s in copies]
    ref = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compile_joint(gm, [x])(x).float().sum().backward()
        ref(x).float().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
