"""Corpus: nn.Modules — user modules inlined, parameters/buffers as get_attr, containers,
training flag and constant attributes guarded, hooks, super().forward."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from _harness import Case as _Case
from _harness import case_params, check_case
from torch import nn

torch.manual_seed(0)

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape):
    return torch.randn(*shape)


def call(m, *args):
    return m(*args)


class MLP(nn.Module):
    def __init__(self, d=8, h=16):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = MLP()
        self.norm = nn.LayerNorm(8)
        self.scale = nn.Parameter(torch.ones(8) * 0.5)
        self.register_buffer("shift", torch.arange(8.0))

    def forward(self, x):
        return self.norm(self.block(x) + x) * self.scale + self.shift


class RawParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))
        self.b = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return x @ self.w + self.b


class SeqIter(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh())

    def forward(self, x):
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return x, len(self.layers), outs[1] + self.layers[-2](x)


class SeqSlice(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x):
        return self.layers[:2](x) + self.layers(x)


class ListOfBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([MLP() for _ in range(3)])
        self.gates = nn.ParameterList([nn.Parameter(torch.full((8,), float(i))) for i in
                                       range(3)])

    def forward(self, x):
        for i, (blk, g) in enumerate(zip(self.blocks, self.gates, strict=True)):
            x = x + blk(x) * g * (i + 1)
        return x + self.blocks[1](x)


class DictOfHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})
        self.bias = nn.ParameterDict({"a": nn.Parameter(torch.ones(2)),
                                      "b": nn.Parameter(torch.zeros(3))})

    def forward(self, x):
        out = {}
        for name, head in self.heads.items():
            out[name] = head(x) + self.bias[name]
        keys = list(self.heads.keys())
        return out, keys, self.heads["b"](x).sum(-1)


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


class IntAttrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_repeat = 3
        self.eps = 1e-3
        self.mode = "sum"
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(self.n_repeat):
            x = self.lin(x) + self.eps
        if self.mode == "sum":
            return x.sum(-1)
        return x.mean(-1)


class HelperMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = F.silu

    def _project(self, x, scale=1.0):
        return self.lin(x) * scale

    def forward(self, x):
        return self.act(self._project(x, scale=2.0)) + self._project(x)


class ScaledLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class WithScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = ScaledLinear(8, 8)

    def forward(self, x):
        return self.a(x).relu()


@dataclasses.dataclass
class Cfg:
    hidden: int = 8
    use_bias: bool = True
    act: str = "relu"


class ConfigModule(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.lin = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.use_bias)

    def forward(self, x):
        y = self.lin(x)
        if self.cfg.act == "relu":
            y = F.relu(y)
        return y.reshape(-1, self.cfg.hidden)


class BatchNormTrain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class KwargsForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, mask=None, scale=1.0):
        y = self.lin(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return y


def call_with_kwargs(m, x, mask):
    return m(x, mask=mask, scale=0.5) + m(x)


class SharedSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.alias = self.lin

    def forward(self, x):
        return self.alias(self.lin(x))


class ChildrenIter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        for child in self.children():
            x = child(x)
        for name, child in self.named_children():
            if name == "a":
                x = x + child(x)
        return x


class ModuleInPlaceBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


train_mlp = MLP()
eval_mlp = MLP().eval()

CASES = [
    Case(call, (MLP(), _t(4, 8)), 1, fullgraph=True, name="mlp"),
    Case(call, (Nested(), _t(4, 8)), 1, fullgraph=True, name="nested_params_buffers"),
    Case(call, (RawParams(), _t(4, 8)), 1, fullgraph=True, name="raw_params"),
    Case(call, (SeqIter(), _t(4, 8)), 1, fullgraph=True, name="sequential_iterate_index"),
    Case(call, (SeqSlice(), _t(4, 8)), 1, fullgraph=True, name="sequential_slice"),
    Case(call, (ListOfBlocks(), _t(4, 8)), 1, fullgraph=True, name="modulelist_paramlist"),
    Case(call, (DictOfHeads(), _t(4, 8)), 1, fullgraph=True, name="moduledict_paramdict"),
    Case(call, (TrainingBranch(), _t(4, 8)), 1, fullgraph=True, name="training_true"),
    Case(call, (TrainingBranch().eval(), _t(4, 8)), 1, fullgraph=True, name="training_false"),
    Case(call, (IntAttrs(), _t(4, 8)), 1, fullgraph=True, name="constant_attrs"),
    Case(call, (HelperMethods(), _t(4, 8)), 1, fullgraph=True, name="helper_methods"),
    Case(call, (WithScaled(), _t(4, 8)), 1, fullgraph=True, name="super_forward_leaf"),
    Case(call, (ConfigModule(Cfg()), _t(4, 8)), 1, fullgraph=True, name="dataclass_config"),
    Case(call, (BatchNormTrain(), _t(2, 3, 5, 5)), 1, fullgraph=True, name="batchnorm_train"),
    Case(call, (BatchNormTrain().eval(), _t(2, 3, 5, 5)), 1, fullgraph=True,
         name="batchnorm_eval"),
    Case(call_with_kwargs, (KwargsForward(), _t(4, 8), _t(4, 8) > 0), 1, fullgraph=True),
    Case(call, (SharedSubmodule(), _t(4, 8)), 1, fullgraph=True, name="shared_submodule"),
    Case(call, (ChildrenIter(), _t(4, 8)), 1, fullgraph=True, name="children_iter"),
    Case(call, (ModuleInPlaceBuffer(), _t(4)), 1, fullgraph=True, name="inplace_buffer"),
    Case(Nested(), (_t(4, 8),), 1, fullgraph=True, name="root_module_nested"),
    Case(SeqIter(), (_t(4, 8),), 1, fullgraph=True, name="root_module_seq"),
]


@case_params(CASES)
def test_module_case(case):
    case.check()


def test_params_are_get_attr_of_same_objects():
    res = check_case(call, (Nested(), _t(4, 8)), 1, fullgraph=True)
    gm, module = res.graphs[0], res.args[0]
    attrs = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert attrs, gm.graph
    own = {id(t) for t in [*module.parameters(), *module.buffers()]}
    for name in attrs:
        # the root holds the compiled side's own parameters/buffers, not copies
        assert id(getattr(gm, name)) in own, name
    # user modules are inlined: only torch's leaf modules are call_module targets
    for node in gm.graph.nodes:
        if node.op == "call_module":
            assert type(gm.get_submodule(node.target)).__module__.startswith("torch.nn")


def _compiled_call():
    """A fresh frontend, ``call`` compiled with a counting backend, and x [4, 8]:
    (compiled call, backend, x)."""
    import kiln_frontend
    from _harness import CountingBackend

    kiln_frontend.reset()
    backend = CountingBackend()
    return kiln_frontend.optimize(backend)(call), backend, _t(4, 8)


def test_training_flag_change_recompiles():
    import kiln_frontend

    m = TrainingBranch()
    f, backend, x = _compiled_call()
    torch.testing.assert_close(f(m, x), m(x))
    m.eval()
    torch.testing.assert_close(f(m, x), m(x))
    assert len(backend.graphs) == 2
    m.train()
    torch.testing.assert_close(f(m, x), m(x))
    assert len(backend.graphs) == 2  # the first entry again
    kiln_frontend.reset()


def test_constant_attr_change_recompiles():
    import kiln_frontend

    m = IntAttrs()
    f, backend, x = _compiled_call()
    torch.testing.assert_close(f(m, x), m(x))
    m.n_repeat = 2
    torch.testing.assert_close(f(m, x), m(x))
    m.mode = "mean"
    torch.testing.assert_close(f(m, x), m(x))
    assert len(backend.graphs) == 3
    kiln_frontend.reset()


def test_other_module_instance_recompiles():
    import kiln_frontend
    from _harness import CountingBackend

    kiln_frontend.reset()
    backend = CountingBackend()
    f = kiln_frontend.optimize(backend)(call)
    m1, m2 = MLP(), MLP()
    x = _t(4, 8)
    torch.testing.assert_close(f(m1, x), m1(x))
    torch.testing.assert_close(f(m2, x), m2(x))
    torch.testing.assert_close(f(m1, x), m1(x))
    assert len(backend.graphs) == 2
    kiln_frontend.reset()


# -- hooks ---------------------------------------------------------------------------------


def _add_hooks(m):
    def pre(mod, args):
        return (args[0] * 2,)

    def post(mod, args, out):
        return out + 1

    def observe(mod, args, out):
        return None

    m.fc1.register_forward_pre_hook(pre)
    m.fc2.register_forward_hook(post)
    m.fc2.register_forward_hook(observe)
    return m


def _add_kwargs_hook(m):
    def pre(mod, args, kwargs):
        return args, {**kwargs, "scale": 3.0}

    m.register_forward_pre_hook(pre, with_kwargs=True)
    return m


def test_forward_hooks_run():
    m = _add_hooks(MLP())
    check_case(call, (m, _t(4, 8)), None)


def test_forward_hooks_fullgraph_inlined():
    m = _add_hooks(MLP())
    check_case(call, (m, _t(4, 8)), 1, fullgraph=True)


def test_pre_hook_with_kwargs():
    m = _add_kwargs_hook(KwargsForward())
    check_case(call, (m, _t(4, 8)), 1, fullgraph=True)


def test_hook_added_after_compile_runs():
    import kiln_frontend
    from _harness import CountingBackend

    kiln_frontend.reset()
    backend = CountingBackend()
    f = kiln_frontend.optimize(backend)(call)
    m = Nested()
    x = _t(4, 8)
    torch.testing.assert_close(f(m, x), m(x))
    handle = m.block.register_forward_hook(lambda mod, a, out: out * 10)
    torch.testing.assert_close(f(m, x), m(x))
    handle.remove()
    torch.testing.assert_close(f(m, x), m(x))
    kiln_frontend.reset()


@pytest.mark.parametrize("train", [True, False])
def test_dropout_modes(train):
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.0 if train else 0.5))
    m.train(train)
    check_case(call, (m, _t(4, 8)), 1, fullgraph=True)
