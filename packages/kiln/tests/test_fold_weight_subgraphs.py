"""Weight-only subgraphs of an inference graph computed once at compile time
(``kiln.passes.fold_weight_subgraphs``, issue 31: DeBERTa's relative-position projections,
a fifth of its FLOPs, ran at every call).

Checked: the fold happens (no GEMM over two weights is left in the ATen graph loopir lowers),
the answer matches eager through ``kiln.compile``, an in-place write to a source weight after
compiling is seen (its version counter is guarded: compiled again), with and without the graph
cache; and what must not fold does not (a weight's view, a weight broadcast to a big tensor,
random numbers)."""

from __future__ import annotations

import operator

import kiln
import kiln.cache as kiln_cache
import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from kiln import stages
from kiln.options import Options


class RelativeProjection(nn.Module):
    """Scores of the input against a projected position table (DeBERTa's c2p term):
    ``x @ linear(table, W, b).T``, the linear reading only weights."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(24, 16))
        self.pos_proj = nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.rand(24) + 0.5)

    def forward(self, x):
        pos = self.pos_proj(self.table) * self.scale[:, None]
        return torch.softmax(x @ pos.t(), dim=-1)


def _aten_after_fold(model, x):
    gm = torch.fx.symbolic_trace(model)
    c = stages.Compile(gm, [x], Options())
    with torch.no_grad():
        stages.run(stages.KILN, c, until="lower")
    return c.aten_gm


def _weight_only_gemms(gm) -> list:
    gemms = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    return [n for n in gm.graph.nodes if n.target in gemms
            and all(a.op == "get_attr" or a.target in (torch.ops.aten.t.default,
                                                      torch.ops.aten.permute.default)
                    for a in n.all_input_nodes)]


def test_weight_only_gemm_folded(needs_cpp):
    model, x = RelativeProjection().eval(), torch.randn(3, 16)
    aten = _aten_after_fold(model, x)
    assert not _weight_only_gemms(aten), aten.code
    assert any(n.op == "get_attr" and n.target.startswith("_kiln_weight_fold_")
               for n in aten.graph.nodes), aten.code


@pytest.mark.parametrize("graph_cache", ["1", "0"])
def test_matches_eager_and_sees_in_place_writes(graph_cache, monkeypatch, tmp_path, needs_cpp):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_GRAPH_CACHE", graph_cache)
    kiln.reset()
    torch.manual_seed(0)
    model, x = RelativeProjection().eval(), torch.randn(3, 16)
    compiled = kiln.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.pos_proj.weight.mul_(-2.0)  # bumps the version counter the fold is guarded by
        model.table.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x))
        model.load_state_dict(RelativeProjection().state_dict())
        torch.testing.assert_close(compiled(x), model(x))
    kiln.reset()


class NotFoldable(nn.Module):
    """Weight-only values that must stay in the graph: a transpose (a view: a layout, not a
    value), a broadcast to a tensor far bigger than the weight, and random numbers."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.v = nn.Parameter(torch.randn(1, 1, 4096))

    def forward(self, x):
        big = (self.v * 2.0).expand(64, 16, 4096)  # 16 MiB from 16 KiB: computed in a kernel
        noise = torch.rand_like(self.w)
        return x @ self.w.t() + (big + x.sum()).sum(dim=(0, 2))[None, :] + 0.0 * noise.sum()


def test_views_broadcasts_and_random_not_folded(needs_cpp):
    model, x = NotFoldable().eval(), torch.randn(3, 16)
    aten = _aten_after_fold(model, x)
    assert not any(n.op == "get_attr" and n.target.startswith("_kiln_weight_fold_")
                   for n in aten.graph.nodes), aten.code
    with torch.no_grad():
        out = kiln.compile(model)(x)
        torch.testing.assert_close(out, x @ model.w.t() + ((model.v * 2.0).expand(
            64, 16, 4096) + x.sum()).sum(dim=(0, 2))[None, :], rtol=1e-4, atol=1e-2)


def test_functional_linear_of_weights_folded(needs_cpp):
    """The fold is a rule about values, not a module pattern: ``F.linear`` of two
    parameters and a bias, then a pointwise op on weights alone."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.randn(8, 16))
            self.b = nn.Parameter(torch.randn(12, 16))
            self.c = nn.Parameter(torch.randn(12))

        def forward(self, x):
            return x @ torch.tanh(F.linear(self.a, self.b, self.c))

    model, x = M().eval(), torch.randn(5, 8)
    aten = _aten_after_fold(model, x)
    assert not _weight_only_gemms(aten), aten.code
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))


def test_cache_hit_computes_folded_constants_from_the_live_weights(monkeypatch, tmp_path,
                                                                   needs_cpp):
    """A graph-cache hit for a model with other weights runs the folded subgraph again on
    them (its recipe), rather than missing on a key of the weights' hash."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1")
    x = torch.randn(3, 16)
    with torch.no_grad():
        for seed in (0, 1):
            kiln.reset()
            torch.manual_seed(seed)
            model = RelativeProjection().eval()
            torch.testing.assert_close(kiln.compile(model)(x), model(x))
            kiln_cache.flush()
            hits = kiln.stats().graph_cache_hits
        assert hits == 1, kiln.stats()
    kiln.reset()


class CpuLiterals(nn.Module):
    """DeBERTa's CPU-made values in a graph of another device: a scale made with
    ``torch.tensor`` on the CPU and divided into the scores, and ``torch.tensor(k).type_as(x)``
    (a copy to x's device at every call)."""

    def forward(self, x):
        scale = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 2.0)
        bucket = torch.tensor(3).type_as(x)
        return x / scale.to(dtype=x.dtype) + bucket


def _captured_cpu_literals() -> torch.fx.GraphModule:
    """``CpuLiterals`` as the frontend captures it: the literals are ``torch.tensor`` calls in
    the graph (made by the trace, not module tensors); ``x.size(-1)`` is 16."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    scale = g.call_function(torch.sqrt, (g.call_function(
        operator.mul, (g.call_function(torch.tensor, (16,), {"dtype": torch.float}), 2.0)),))
    bucket = g.call_method("type_as", (g.call_function(torch.tensor, (3,)), x))
    scaled = g.call_function(operator.truediv, (x, g.call_method("to", (scale,), {"dtype": torch.float})))
    g.output(g.call_function(operator.add, (scaled, bucket)))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _fold_on(device: str):
    import kiln_aotgrad
    from kiln.passes.fold_weight_subgraphs import RECIPES, fold_weight_subgraphs, recompute

    aten = kiln_aotgrad.trace_inference(_captured_cpu_literals(), [torch.randn(2, 16, device=device)])
    made = set(getattr(aten.meta.get("kiln"), "trace_constants", ()))
    fold_weight_subgraphs(aten, {n.target for n in aten.graph.nodes
                                 if n.op == "get_attr" and n.target not in made})
    return aten, RECIPES, recompute


def test_cpu_literals_in_another_devices_graph_fold_onto_it():
    """On the meta device (the pass only asks "the CPU, or the graph's device?"): nothing is
    computed on the CPU at run time any more, and the 0-dim scale is a constant on the
    graph's device, recomputed the same from its recipe (a graph-cache hit)."""
    aten, recipes_key, recompute = _fold_on("meta")
    on_cpu = [n.format_node() for n in aten.graph.nodes if n.op == "call_function"
              and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].device.type == "cpu"]
    assert not on_cpu, aten.code
    folded = {n.target: getattr(aten, n.target) for n in aten.graph.nodes
              if n.op == "get_attr" and n.target.startswith("_kiln_weight_fold_")}
    assert folded and all(t.device.type == "meta" for t in folded.values()), folded
    for name in folded:
        again = recompute(aten.meta[recipes_key][name], [])
        assert again.device.type == "meta" and again.shape == folded[name].shape


def test_cpu_graph_keeps_its_literal_arithmetic():
    """A CPU graph's literal-only subgraphs stay: index arithmetic its kernels do for free."""
    aten, _, _ = _fold_on("cpu")
    assert not any(n.op == "get_attr" and n.target.startswith("_kiln_weight_fold_")
                   for n in aten.graph.nodes), aten.code


def test_cpu_literals_model_matches_eager(needs_cpp):
    model, x = CpuLiterals(), torch.randn(2, 16)
    torch.testing.assert_close(kiln.compile(model)(x), model(x))
