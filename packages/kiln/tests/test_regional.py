"""Regional compilation: ``kiln.compile_repeated_blocks`` and ``@kiln.compile_region`` compile
a repeated block once for every instance (its parameters are graph inputs), equal to eager in
outputs and gradients; an instance with other shapes recompiles, as one whose Python state
the forward reads differs."""

from __future__ import annotations

import copy

import kiln
import kiln_frontend
import pytest
import torch
import torch.nn as nn

pytestmark = pytest.mark.usefixtures("needs_cpp")


class Stack(nn.Module):
    def __init__(self, n=4, d=16):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
            for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_n_instances_compile_once_and_train_as_eager():
    torch.manual_seed(0)
    model = Stack()
    ref = copy.deepcopy(model)
    kiln.reset()
    kiln.compile_repeated_blocks(model)
    for _step in range(2):
        x = torch.randn(2, 5, 16, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out, expected = model(x), ref(x2)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert kiln_frontend.eval_frame.counters["compiles"] == 1  # one region, four layers
    assert kiln.stats().training_graphs == 1


def test_other_shapes_recompile():
    torch.manual_seed(0)
    small, wide = Stack(2, 16), Stack(2, 32)
    refs = copy.deepcopy(small), copy.deepcopy(wide)
    kiln.reset()
    with torch.no_grad():
        for m, ref, d in zip((small, wide), refs, (16, 32), strict=True):
            kiln.compile_repeated_blocks(m)
            x = torch.randn(1, 3, d)
            torch.testing.assert_close(m(x), ref(x))
    assert kiln_frontend.eval_frame.counters["compiles"] == 2


class Scaled(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        return self.fc(x).relu() * self.scale


def test_decorator_form_and_python_state_the_forward_reads():
    region_cls = kiln.compile_region(type("ScaledRegion", (Scaled,), {}))
    torch.manual_seed(0)
    blocks = [region_cls(2.0), region_cls(2.0), region_cls(3.0)]
    kiln.reset()
    x = torch.randn(4, 8)
    with torch.no_grad():
        for b in blocks:
            torch.testing.assert_close(b(x), b.fc(x).relu() * b.scale)
    # the two with scale 2 share one compile; scale 3 fails its guard and recompiles
    assert kiln_frontend.eval_frame.counters["compiles"] == 2


def test_inference_region_is_one_graph_of_the_layers_math():
    """Under no_grad a TransformerEncoderLayer's forward walks its modules (its fast-path
    check) inside the region's functional_call: one graph, not a break that left every
    layer eager; and the graph holds the layer's math, which kiln compiles (as whole-model
    compilation traces it), not the fused native kernel of torch's fast path."""
    torch.manual_seed(0)
    model = Stack().eval()
    ref = copy.deepcopy(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    kiln.reset()
    kiln.compile_repeated_blocks(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 5, 16)
            torch.testing.assert_close(model(x), ref(x))
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes}
    assert not any("_transformer_encoder_layer_fwd" in t for t in targets), targets
    assert any("linear" in t for t in targets), targets


def test_a_hook_on_one_instances_submodule_counts_for_that_instance_only():
    """Each call copies the instance's submodules' state onto the template: a forward hook
    added to one layer's submodule after the first calls is seen there (a recompile), and
    the next layer, whose tables are empty, runs without it."""
    torch.manual_seed(0)
    model = Stack(3).eval()
    ref = copy.deepcopy(model)
    kiln.reset()
    kiln.compile_repeated_blocks(model)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))
        for m in (model, ref):
            m.layers[1].linear2.register_forward_hook(lambda mod, args, out: out * 2)
        torch.testing.assert_close(model(x), ref(x))
        torch.testing.assert_close(model(x), ref(x))
