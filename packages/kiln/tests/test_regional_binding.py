"""Regional compilation's per-instance binding (kiln.regional._Binding): a block's call reads
its module tree, tables and tensors as found once, and checks per call only what can change
cheaply. Each test changes one thing a user may change between calls (a parameter replaced,
``.data`` set, train()/eval(), hooks, a submodule replaced, an attribute deleted or added, a
tensor registered or set to None) and checks the compiled model against eager after it: each
fails when the check that covers it is taken out."""

from __future__ import annotations

import copy

import kiln
import kiln_frontend
import pytest
import torch
import torch.nn as nn

pytestmark = pytest.mark.usefixtures("needs_cpp")


class Block(nn.Module):
    """Reads what a user may change: its training flag and a submodule's, an optional
    attribute, an optional buffer."""

    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.gate = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.ones(1))
        self.factor = 2.0

    def forward(self, x):
        y = self.fc(x).relu() * self.scale
        y = y * (3.0 if self.training else getattr(self, "factor", 1.0))
        y = y + (1.0 if self.gate.training else 0.0) + getattr(self, "offset", 0.0)
        if hasattr(self, "shift"):
            y = y + self.shift
        return self.gate(y)


class Stack(nn.Module):
    def __init__(self, n=3, d=8):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _pair(n=3):
    torch.manual_seed(0)
    model = Stack(n).eval()
    ref = copy.deepcopy(model)
    kiln.reset()
    kiln.compile_repeated_blocks(model)
    return model, ref


def _same(model, ref, x):
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))


def _both(model, ref, change):
    for m in (model, ref):
        change(m)


X = torch.randn(4, 8)


def test_a_replaced_parameter_is_read():
    model, ref = _pair()
    _same(model, ref, X)
    _both(model, ref, lambda m: setattr(m.layers[1].fc, "weight",
                                        nn.Parameter(torch.full((8, 8), 0.5))))
    _same(model, ref, X)


def test_data_set_to_other_values_and_another_shape():
    model, ref = _pair()
    _same(model, ref, X)
    with torch.no_grad():
        for m in (model, ref):
            m.layers[0].fc.weight.data = torch.full((8, 8), 0.25)
            m.layers[2].scale.data = torch.arange(8.0)  # (1,) -> (8,): a recompile
    _same(model, ref, X)
    assert kiln_frontend.eval_frame.counters["compiles"] == 2


def test_train_and_eval_of_one_layer_and_of_one_submodule():
    model, ref = _pair()
    _same(model, ref, X)
    _both(model, ref, lambda m: m.layers[1].train())
    _same(model, ref, X)
    _both(model, ref, lambda m: m.layers[1].eval())
    _both(model, ref, lambda m: m.layers[2].gate.train())
    _same(model, ref, X)


def test_hooks_added_to_a_layer_and_to_its_submodule():
    model, ref = _pair()
    _same(model, ref, X)
    _both(model, ref, lambda m: m.layers[0].register_forward_hook(lambda mod, a, out: out * 2))
    _both(model, ref, lambda m: m.layers[1].register_forward_pre_hook(
        lambda mod, a: (a[0] + 1,)))
    _both(model, ref, lambda m: m.layers[2].gate.register_forward_hook(
        lambda mod, a, out: out - 1))
    _same(model, ref, X)
    _same(model, ref, X)


def test_a_replaced_submodule_is_read():
    model, ref = _pair()
    _same(model, ref, X)
    torch.manual_seed(1)
    new = nn.Linear(8, 8)
    model.layers[1].fc, ref.layers[1].fc = new, copy.deepcopy(new)
    _same(model, ref, X)


def test_an_attribute_deleted_and_one_added():
    model, ref = _pair()
    _same(model, ref, X)
    _both(model, ref, lambda m: delattr(m.layers[0], "factor"))  # one key fewer
    _same(model, ref, X)
    for m in (model, ref):  # one key gone and another come: the same number of keys
        del m.layers[1].factor
        m.layers[1].offset = 5.0
    _same(model, ref, X)


def test_a_tensor_registered_or_set_to_none():
    model, ref = _pair()
    _same(model, ref, X)
    _both(model, ref, lambda m: m.layers[1].register_buffer("shift", torch.full((8,), 7.0)))
    _same(model, ref, X)
    _both(model, ref, lambda m: setattr(m.layers[2].gate, "bias", None))
    _same(model, ref, X)


def test_a_call_reads_no_module_walk():
    """The steady call binds once: no named_modules walk per call."""
    model, _ = _pair()
    _same(model, model, X)
    calls = []
    original = nn.Module.named_modules

    def counting(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    nn.Module.named_modules = counting
    try:
        with torch.no_grad():
            model(X)
    finally:
        nn.Module.named_modules = original
    assert calls == []


def test_a_decorated_instance_is_freed():
    """The decorator keeps each instance's binding in a WeakKeyDictionary: the binding holds
    its instance weakly, so a dropped instance is freed."""
    import gc
    import weakref

    region_cls = kiln.compile_region(type("FreedBlock", (Block,), {}))
    torch.manual_seed(0)
    block = region_cls().eval()
    kiln.reset()
    with torch.no_grad():
        torch.testing.assert_close(block(X), Block.forward(block, X))
    ref = weakref.ref(block)
    del block
    gc.collect()
    assert ref() is None
