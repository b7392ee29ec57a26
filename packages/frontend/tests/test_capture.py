"""convert_frame on straight-line tensor code: one graph, correct results, CompiledFrame
fields, trackers (containers, inlining, torch functions, builtins), nn.Modules, debug
printouts."""

from __future__ import annotations

import inspect
import operator

import _capture_harness as harness
import pytest
import torch
import torch.nn.functional as F
from kiln_frontend.convert import CompiledFrame, convert_frame
from kiln_frontend.exc import BackendCompilerFailed
from kiln_frontend.guards import GuardKind
from torch import nn


def run_once(fn, *args, expect_graphs=1, **kwargs):
    backend = harness.Backend()
    cap = harness.Capture(backend)
    out = cap(fn, *args, **kwargs)
    expected = fn(*args, **kwargs)
    torch.testing.assert_close(out, expected)
    if expect_graphs is not None:
        assert len(backend.graphs) == expect_graphs, [g.graph for g in backend.graphs]
    return backend, cap


# -- straight-line code ---------------------------------------------------------------


def straight(a, b):
    x = a / (torch.abs(a) + 1)
    y = torch.sin(x) * b.cos() - 2.0
    return y @ b.T, -y


def test_straight_line_one_graph_and_compiled_frame():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    backend = harness.Backend()
    info = harness.frame_info(straight, (a, b))
    cf = convert_frame(info, compiler_fn=backend, nopython=True, frame_state={})
    assert isinstance(cf, CompiledFrame)
    assert len(cf.graphs) == 1 and cf.graphs[0] is backend.graphs[0]
    assert cf.check_fn(a, b)
    out = cf.fn(a, b)
    ref = straight(a, b)
    torch.testing.assert_close(out, ref)
    assert cf.code is cf.fn.__code__
    assert cf.fn.__globals__ is straight.__globals__
    gm = cf.graphs[0]
    assert [n.op for n in gm.graph.nodes].count("placeholder") == 2
    assert list(gm.graph.nodes)[-1].op == "output"
    # the compiled callable is installed as __compiled_fn_<n>
    name = next(n for n in cf.code.co_names if n.startswith("__compiled_fn_"))
    assert callable(straight.__globals__[name])


def no_tensor_ops(a, n):
    return a, n + 1


def test_nothing_worth_compiling_returns_none():
    info = harness.frame_info(no_tensor_ops, (torch.randn(2), 3))
    assert convert_frame(info, compiler_fn=harness.Backend(), nopython=False,
                         frame_state={}) is None


def with_star(x, *args, scale=2, **kwargs):
    return x * scale + args[0] + kwargs["bias"]


def test_fn_takes_all_slots_positionally():
    x = torch.randn(3)
    slots = harness.slot_values(with_star, (x, x), {"bias": 1.0})
    cf = convert_frame(harness.frame_info(with_star, slots), compiler_fn=harness.Backend(),
                       nopython=True, frame_state={})
    assert not cf.code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    assert cf.code.co_argcount == 4 and cf.code.co_kwonlyargcount == 0
    torch.testing.assert_close(cf.fn(*slots), with_star(x, x, bias=1.0))
    assert cf.check_fn(*slots)
    # the constants were specialized and guarded
    assert not cf.check_fn(x, 3, (x,), {"bias": 1.0})


def test_backend_failure_is_wrapped():
    def bad_backend(gm, example_inputs):
        raise RuntimeError("boom")

    with pytest.raises(BackendCompilerFailed, match="boom"):
        convert_frame(harness.frame_info(straight, (torch.randn(2, 2), torch.randn(2, 2))),
                      compiler_fn=bad_backend, nopython=False, frame_state={})


# -- trackers -------------------------------------------------------------------------


def helper(x, scale=2.0, *, bias=1):
    return x * scale + bias


def uses_helper(x, y):
    return helper(x, 3.0, bias=2) + helper(y)


def test_user_function_inlined():
    backend, _ = run_once(uses_helper, torch.randn(3), torch.randn(3))
    assert backend.call_targets(0).count(operator.mul) == 2


def containers(x, ws):
    d = {"a": x, "b": x + 1}
    t = (x, d["b"])
    a, b = t
    lst = [a, b]
    lst.append(a * b)
    for w in ws:
        x = x @ w
    for i in range(3):
        x = x + i
    squares = [v * v for v in lst]
    first, *rest = squares
    return lst, d, x, torch.cat(rest), first, len(squares)


def test_containers_loops_and_comprehensions():
    x = torch.randn(4, 4)
    run_once(containers, x, [torch.randn(4, 4), torch.randn(4, 4)])


def torch_calls(x):
    return (torch.sum(x, dim=0, keepdim=True), x.view(-1, 2).transpose(0, 1), F.relu(x),
            x.shape[0], x.size(1), x.dtype == torch.float32, x.abs().max(dim=0).values,
            torch.zeros(2, dtype=x.dtype), x[0, 1:], x.T, isinstance(x, torch.Tensor))


def test_torch_functions_methods_and_attributes():
    backend, _ = run_once(torch_calls, torch.randn(4, 4))
    targets = backend.call_targets(0)
    assert torch.sum in targets and F.relu in targets and "view" in targets
    assert torch.zeros in targets


def setitem(x):
    y = x.clone()
    y[0] = 5
    y[1:, 0] += 1
    return y


def test_tensor_setitem():
    run_once(setitem, torch.randn(3, 3))


def optional(x, y=None):
    if y is None:
        return x + 1
    return x + y


def test_none_default_specializes():
    run_once(optional, torch.randn(2))
    run_once(optional, torch.randn(2), torch.randn(2))


def closure_maker():
    k = torch.ones(4)
    scale = 3

    def inner(x):
        return (x + k) * scale

    return inner


def test_closure_variables():
    run_once(closure_maker(), torch.randn(4))


# -- nn.Module ------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.5)
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.scale = 2.0

    def forward(self, x):
        y = self.drop(self.act(self.lin(x)))
        return self.seq(y) * self.scale + self.lin.weight.sum()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])

    def forward(self, x):
        x = self.block(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_module_forward_call_module_nodes():
    m = Block().eval()
    x = torch.randn(4, 8)
    backend, cap = run_once(m, x)
    gm = backend.graphs[0]
    mods = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert mods == ["self_lin", "self_act", "self_drop", "self_seq_0", "self_seq_1"]
    assert gm.get_submodule("self_lin") is m.lin  # the root holds the very same modules
    assert any(n.op == "get_attr" for n in gm.graph.nodes)  # self.lin.weight
    guards = {(g.source.name(), g.kind) for g in cap.frames[0].guards if g.source}
    assert ("L['self']", GuardKind.NN_MODULE) in guards
    assert ("L['self'].lin", GuardKind.NN_MODULE) in guards
    # train() flips the NN_MODULE guard
    assert cap.frames[0].check_fn(m, x)
    m.train()
    assert not cap.frames[0].check_fn(m, x)
    assert "training" in cap.frames[0].check_fn.failure_reason(m, x)


def test_nested_user_module_inlined():
    m = Outer().eval()
    backend, _ = run_once(m, torch.randn(2, 8))
    mods = [n.target for n in backend.graphs[0].graph.nodes if n.op == "call_module"]
    assert mods[-2:] == ["self_layers_0", "self_layers_1"]
    assert mods[0] == "self_block_lin"


def drop_dropout(gm):
    for node in list(gm.graph.nodes):
        is_mod = node.op == "call_module" and isinstance(gm.get_submodule(node.target),
                                                         nn.Dropout)
        is_fn = node.op == "call_function" and node.target in (F.dropout, torch.dropout)
        if is_mod or is_fn:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(p=0.5)

    def forward(self, x):
        return self.drop(self.relu(self.lin(x)))


def test_backend_that_deletes_dropout_changes_what_runs():
    torch.manual_seed(0)
    m = DropNet().train()
    x = torch.randn(64, 32)
    backend = harness.Backend(transform=drop_dropout)
    cap = harness.Capture(backend)
    out = cap(m, x)
    no_dropout = m.relu(m.lin(x))
    torch.testing.assert_close(out, no_dropout)
    eager = m(x)  # train mode: dropout zeroes about half and doubles the rest
    assert not torch.allclose(out, eager)
    kept = eager != 0
    torch.testing.assert_close(eager[kept], 2 * no_dropout[kept])
    dropped = (~kept) & (no_dropout != 0)
    assert 0.3 < dropped.float().sum() / (no_dropout != 0).float().sum() < 0.7
    assert not any(n.op == "call_module" and n.target == "drop"
                   for n in backend.graphs[0].graph.nodes)


def functional_dropout(x):
    return F.dropout(torch.relu(x), p=0.5, training=True)


def test_backend_that_deletes_functional_dropout():
    x = torch.randn(100)
    backend = harness.Backend(transform=drop_dropout)
    cap = harness.Capture(backend)
    torch.testing.assert_close(cap(functional_dropout, x), torch.relu(x))


# -- debug printouts ------------------------------------------------------------------


def test_debug_printouts(monkeypatch, capsys):
    monkeypatch.setenv("KILN_DEBUG", "1")
    cap = harness.Capture(harness.Backend())
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    cap(straight, a, b)
    out = capsys.readouterr().out
    assert "TRACED GRAPH" in out
    header = next(line for line in out.splitlines() if line.startswith("opcode"))
    assert header.split() == ["opcode", "name", "target", "args", "kwargs"]
    assert "placeholder    a" in out
    assert "ORIGINAL BYTECODE straight" in out
    assert "MODIFIED BYTECODE straight" in out
    assert "GUARDS:" in out
    assert " - local 'a' TENSOR_MATCH" in out
    assert " - global 'torch' FUNCTION_MATCH" in out
    modified = out.split("MODIFIED BYTECODE")[1]
    assert "__compiled_fn_" in modified


def test_no_printouts_by_default(monkeypatch, capsys):
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    cap = harness.Capture(harness.Backend())
    cap(straight, torch.randn(3, 2), torch.randn(3, 2))
    assert "TRACED GRAPH" not in capsys.readouterr().out





class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = F.softmax(att, dim=-1)
        return x + self.proj(att @ v)


def test_attention_block_one_graph():
    backend, _ = run_once(Attention(), torch.randn(2, 5, 8))
    mods = [n.target for n in backend.graphs[0].graph.nodes if n.op == "call_module"]
    assert mods == ["self_norm", "self_qkv", "self_proj"]


def misc_ops(x):
    a = torch.tensor([1.0, 2.0])
    b = x.float().new_zeros(2) + a
    c = torch.cat([x, x], dim=0).to(torch.float64)
    b_, c_ = x.shape
    d = x.reshape(b_ * c_) / (b_ + c_)
    return b, c, d, x[:, None, ...], x.unsqueeze(0).expand(3, -1, -1).contiguous()


def test_misc_tensor_code():
    run_once(misc_ops, torch.randn(4, 4))


class MyLinear(nn.Linear):
    pass


def test_subclass_keeping_torch_forward_is_a_leaf():
    m = nn.Sequential(MyLinear(3, 3), nn.ReLU())
    backend, _ = run_once(m, torch.randn(2, 3))
    assert [n.op for n in backend.graphs[0].graph.nodes].count("call_module") == 2
