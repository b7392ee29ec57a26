"""nn.Module patterns in captured frames, in the style of TorchDynamo's test_nn_module.py
(issue 27): container iteration, hooks, buffers, parameters loops, submodules made in
the frame, attribute mutation. Each case is checked against eager and against
torch.compile's graph count (``_reference_cases``)."""

from __future__ import annotations

import pytest
import torch
from _reference_cases import Cases
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _x(*size):
    return torch.randn(*(size or (2, 4)))


case = Cases(_x)


@case
def module_list_enumerate_and_index(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x) * (i + 1)
            return self.layers[-1](x) + self.layers[0](x)

    return C(M())(_x())


@case
def module_list_slice_and_len(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

        def forward(self, x):
            for layer in self.layers[1:3]:
                x = layer(x)
            return x * len(self.layers)

    return C(M())(_x())


@case
def module_list_zip_reversed(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
            self.b = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x):
            for la, lb in zip(self.a, reversed(self.b), strict=True):
                x = la(x) + lb(x)
            return x

    return C(M())(_x())


@case
def module_dict_items_and_keys(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

        def forward(self, x):
            out = {k: head(x) for k, head in self.heads.items()}
            return out, list(self.heads.keys()), "a" in self.heads

    return C(M())(_x())


@case
def module_list_and_dict_membership(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
            self.extra = nn.Linear(4, 4)
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 2)})
            self.params = nn.ParameterDict({"w": nn.Parameter(torch.ones(4))})

        def forward(self, x):
            if self.extra not in self.blocks and self.blocks[0] in self.blocks:
                x = self.blocks[0](x)
            if "b" not in self.heads and "w" in self.params:
                x = x * self.params["w"]
            return x

    return C(M())(_x())


@case
def sequential_indexing_and_slicing(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())

        def forward(self, x):
            return self.seq[:2](x) + self.seq[-1](x) + self.seq(x)

    return C(M())(_x())


@case
def parameter_list_and_dict(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])
            self.pd = nn.ParameterDict({"s": nn.Parameter(torch.ones(4))})

        def forward(self, x):
            for w in self.ws:
                x = x * w
            return x + self.pd["s"]

    return C(M())(_x())


@case
def named_parameters_loop(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 4)
            self.l2 = nn.Linear(4, 4)

        def forward(self, x):
            total = 0
            for name, p in self.named_parameters():
                if "weight" in name:
                    total = total + p.sum()
            return self.l2(self.l1(x)) + total

    return C(M())(_x())


@case
def parameters_count(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 4)

        def forward(self, x):
            n = sum(p.numel() for p in self.parameters())
            return self.l1(x) * n

    return C(M())(_x())


@case
def buffers_registered_and_updated(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("running", torch.zeros(4))
            self.register_buffer("steps", torch.tensor(0))

        def forward(self, x):
            self.running.mul_(0.9).add_(x.mean(0) * 0.1)
            self.steps += 1
            return x - self.running

    m = M()
    g = C(m)
    return g(_x()), g(_x()), m.running.clone(), m.steps.clone()


@case
def named_buffers_and_modules(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            names = [n for n, _ in self.named_modules()]
            nb = len(list(self.named_buffers()))
            return self.l(x) * nb, names

    return C(M().eval())(_x())


@case
def training_flag_branch(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            if self.training:
                return self.l(x) * 2
            return self.l(x)

    m = M()
    g = C(m)
    a = g(_x())
    m.eval()
    return a, g(_x())


@case
def forward_pre_and_post_hooks(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(x)

    m = M()
    m.l.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.l.register_forward_hook(lambda mod, args, out: out + 1)
    return C(m)(_x())


@case
def forward_hook_on_compiled_module(C):
    m = nn.Linear(4, 4)
    m.register_forward_hook(lambda mod, args, out: out.relu())
    return C(m)(_x())


@case
def module_attribute_counter_mutation(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.l(x)

    m = M()
    g = C(m)
    return g(_x()), m.calls


@case.program
def module_created_in_forward(x):
    act = nn.ReLU()
    drop = nn.Dropout(0.0)
    return drop(act(x))


@case
def functional_with_module_weights(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return nn.functional.linear(x, self.l.weight * 2, self.l.bias)

    return C(M())(_x())


@case
def submodule_method_call(C):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def helper(self, x, k=2):
            return self.l(x) * k

        def forward(self, x):
            return self.helper(x)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = Block()

        def forward(self, x):
            return self.b.helper(x, k=3) + self.b(x)

    return C(M())(_x())


@case
def module_getattr_of_children(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(3):
                setattr(self, f"layer{i}", nn.Linear(4, 4))

        def forward(self, x):
            for i in range(3):
                x = getattr(self, f"layer{i}")(x)
            return x

    return C(M())(_x())


@case
def module_children_types(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.ReLU()
            self.c = nn.Linear(4, 4)

        def forward(self, x):
            for child in self.children():
                if isinstance(child, nn.Linear):
                    x = child(x)
            return x

    return C(M())(_x())


@case
def module_property_and_method(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        @property
        def scale(self):
            return self.l.out_features * 0.5

        def forward(self, x):
            return self.l(x) * self.scale

    return C(M())(_x())


@case
def module_super_forward(C):
    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(x)

    class Child(Base):
        def forward(self, x):
            return super().forward(x).relu() + 1

    return C(Child())(_x())


@case
def module_state_dict_keys(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(x), self.l.in_features, self.l.weight.shape

    return C(M())(_x())


@case
def module_apply_in_loop_of_weights(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ls = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(2)])

        def forward(self, x):
            ws = [lin.weight for lin in self.ls]
            return x @ torch.stack(ws).sum(0)

    return C(M())(_x())


@case
def module_kwargs_forward(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x, *, scale=1.0, mask=None):
            y = self.l(x) * scale
            if mask is not None:
                y = y.masked_fill(mask, 0.0)
            return y

    m = M()
    g = C(m)
    return g(_x(), scale=2.0), g(_x(), mask=torch.ones(2, 4, dtype=torch.bool))


@case
def module_dropout_in_eval(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)
            self.d = nn.Dropout(0.5)

        def forward(self, x):
            return self.d(self.l(x))

    return C(M().eval())(_x())


@case
def module_rnn_cell_loop(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(4, 4)

        def forward(self, xs):
            h = torch.zeros(2, 4)
            for t in range(xs.shape[0]):
                h = self.cell(xs[t], h)
            return h

    return C(M())(torch.randn(3, 2, 4))


@case
def module_embedding_and_layernorm(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.ln = nn.LayerNorm(4)

        def forward(self, ids):
            return self.ln(self.emb(ids)).mean(1)

    return C(M())(torch.tensor([[1, 2, 3], [4, 5, 6]]))


@case
def module_identity_and_flatten(C):
    m = nn.Sequential(nn.Identity(), nn.Flatten(), nn.Unflatten(1, (2, 2)))
    return C(m)(_x(2, 2, 2))


@case
def module_in_list_argument(C):
    layers = [nn.Linear(4, 4), nn.Linear(4, 4)]

    def f(mods, x):
        for m in mods:
            x = m(x)
        return x

    return C(f)(layers, _x())


@case
def module_call_twice_shares_weights(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(self.l(x))

    return C(M())(_x())


@case
def module_with_grad_training_step(C):
    m = nn.Linear(4, 1)

    def f(x):
        out = m(x).sum()
        return out

    out = C(f)(_x())
    out.backward()
    return out.detach(), m.weight.grad.clone()


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
