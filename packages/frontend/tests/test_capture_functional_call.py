"""``torch.func.functional_call`` with ``fullgraph=True`` (issue 10): the module's forward is
traced with the given parameters and buffers in place of its own, in one graph, and the
module is left untouched."""

from __future__ import annotations

import pytest
import torch
from _counting_backend import CountingBackend, one_graph
from kiln_frontend import compile as kiln_compile
from kiln_frontend.exc import Unsupported
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x, scale=1.0):
        return self.head(torch.relu(self.norm(self.lin(x)))) * scale



@pytest.mark.filterwarnings("ignore:`torch.nn.utils.stateless.functional_call` is deprecated")
@pytest.mark.parametrize("call", [torch.func.functional_call,
                                  torch.nn.utils.stateless.functional_call])
def test_functional_call_replaces_parameters_inone_graph(call):
    net = Net().eval()
    params = {k: torch.randn_like(v) for k, v in net.named_parameters()}
    before = {k: v.clone() for k, v in net.state_dict().items()}

    def f(x):
        return call(net, params, (x,), {"scale": 2.0})

    gm = one_graph(f, torch.randn(3, 4))
    # the given tensors are used, not the module's own
    eager_own = net(torch.ones(3, 4))
    torch.testing.assert_close(kiln_compile(f, backend="eager")(torch.ones(3, 4)),
                               call(net, params, (torch.ones(3, 4),), {"scale": 2.0}))
    assert not torch.allclose(eager_own, call(net, params, (torch.ones(3, 4),), {"scale": 2.0}))
    assert "call_module" not in {n.op for n in gm.graph.nodes}
    for k, v in net.state_dict().items():  # nothing swapped in for good
        assert torch.equal(v, before[k]), k


def test_functional_call_partial_dict_buffers_and_tuple_of_dicts():
    net = Net().eval()
    weights = {"lin.weight": torch.randn(4, 4)}
    buffers = {"norm.running_mean": torch.randn(4)}

    def f(x):
        return torch.func.functional_call(net, (weights, buffers), x)

    one_graph(f, torch.randn(3, 4))


def test_functional_call_tied_weights_follow_the_given_one():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3, bias=False)
            self.b = nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    m = Tied()
    params = {"a.weight": torch.randn(3, 3)}

    def f(x):
        return torch.func.functional_call(m, params, (x,))

    one_graph(f, torch.randn(2, 3))


def test_functional_call_with_an_unknown_name_is_refused_not_wrong():
    net = Net().eval()

    def f(x):
        return torch.func.functional_call(net, {"nope": torch.ones(1)}, (x,))

    with pytest.raises(Unsupported, match="not a parameter or buffer"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3, 4))


def test_functional_call_new_values_each_call():
    net = nn.Linear(2, 2)

    def f(x, w):
        return torch.func.functional_call(net, {"weight": w}, (x,))

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(3, 2), torch.randn(2, 2)
        torch.testing.assert_close(compiled(x, w), f(x, w))
    assert len(backend.graphs) == 1


class HookCheckingNet(Net):
    """Walks its submodules (as TransformerEncoderLayer's fast-path check does) before
    running: inside functional_call that lists modules, never the real parameters."""

    def forward(self, x, scale=1.0):
        if any(len(m._forward_hooks) for m in self.modules()):
            scale = scale * 3
        n = len([name for name, _ in self.named_children()])
        return super().forward(x, scale) + n


def test_functional_call_walking_the_module_tree_is_one_graph():
    net = HookCheckingNet().eval()
    params = {k: torch.randn_like(v) for k, v in net.named_parameters()}

    def f(x):
        return torch.func.functional_call(net, params, (x,))

    one_graph(f, torch.randn(3, 4))
    x = torch.randn(3, 4)
    torch.testing.assert_close(kiln_compile(f, backend="eager", fullgraph=True)(x), f(x))


def test_functional_call_listing_parameters_is_refused_not_wrong():
    class Summing(Net):
        def forward(self, x):
            return super().forward(x) + sum(p.sum() for p in self.parameters())

    net = Summing().eval()

    def f(x):
        return torch.func.functional_call(net, {"lin.weight": torch.zeros(4, 4)}, (x,))

    with pytest.raises(Unsupported, match="would list the real parameters"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.randn(3, 4))
