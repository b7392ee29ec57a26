"""trace_inference: every test runs the ATen graph and compares it with eager."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from kiln_aotgrad import (
    CORE_OPS,
    AliasedInputMutationError,
    non_core_ops,
    restore_outputs,
    trace_inference,
)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

aten = torch.ops.aten


def assert_aten_graph(aten_gm: torch.fx.GraphModule) -> None:
    """The contract's shape: ATen ops from CORE_OPS only, meta["val"] everywhere, one output
    node returning a flat tuple."""
    assert non_core_ops(aten_gm) == set(), aten_gm.code
    for node in aten_gm.graph.nodes:
        if node.op == "call_function":
            target = node.target
            assert isinstance(target, torch._ops.OpOverload) or target in (
                operator.getitem,
                operator.add,
                operator.sub,
                operator.mul,
                operator.floordiv,
                operator.mod,
                operator.truediv,
                torch.sym_max,
                torch.sym_min,
                torch.sym_sum,
            ), f"unexpected target {target}"
            if isinstance(target, torch._ops.OpOverload):
                assert target in CORE_OPS
        assert "val" in node.meta, f"{node.format_node()} has no meta['val']"
        if node.op == "get_attr":
            assert isinstance(node.meta["val"], torch.Tensor)
    outputs = [n for n in aten_gm.graph.nodes if n.op == "output"]
    assert len(outputs) == 1
    (result,) = outputs[0].args
    assert isinstance(result, tuple)
    assert all(isinstance(r, torch.fx.Node) for r in result)
    aten_gm.graph.lint()


def run_and_compare(fn, gm, inputs, **kw):
    """Trace gm on clones of inputs, run the ATen graph on other clones, compare outputs and
    (mutated) inputs with eager on a third set."""
    trace_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    aten_gm = trace_inference(gm, trace_in)
    assert_aten_graph(aten_gm)
    run_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    eager_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    flat = aten_gm(*run_in)
    assert isinstance(flat, tuple)
    got = restore_outputs(aten_gm, flat)
    expected = fn(*eager_in)
    torch.testing.assert_close(got, expected, **kw)
    torch.testing.assert_close(run_in, eager_in, **kw)
    return aten_gm


# ------------------------------------------------------------------ functions and modules


def test_function_pointwise_and_reductions():
    def f(x, y):
        a = torch.sin(x) + torch.cos(y)
        return a.sum(-1), a.amax(0), torch.where(a > 0, a, -a).mean()

    gm = torch.fx.symbolic_trace(f)
    run_and_compare(f, gm, [torch.randn(4, 5), torch.randn(4, 5)])


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = self.drop(F.gelu(self.fc2(x)))
        return self.fc3(x)


def test_mlp_module_eval_dropout():
    m = MLP().eval()
    gm = torch.fx.symbolic_trace(m)
    aten_gm = run_and_compare(m, gm, [torch.randn(6, 8)])
    targets = {n.target for n in aten_gm.graph.nodes if n.op == "call_function"}
    assert aten.addmm.default in targets  # kept whole: an extern candidate
    assert aten.native_dropout.default not in targets  # eval-mode dropout is gone
    # parameters stay attributes of the graph (same tensor objects), not new inputs
    assert [n.op for n in aten_gm.graph.nodes].count("placeholder") == 1
    assert aten_gm.get_parameter("fc1.weight") is m.fc1.weight


def test_parameters_updated_in_place_are_seen():
    m = nn.Linear(4, 4)
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(2, 4)
    aten_gm = trace_inference(gm, [x])
    with torch.no_grad():
        m.weight.mul_(2)
    torch.testing.assert_close(aten_gm(x)[0], m(x))


def test_layernorm_decomposed():
    m = nn.LayerNorm(16)
    with torch.no_grad():
        m.weight.uniform_()
        m.bias.uniform_()
    gm = torch.fx.symbolic_trace(m)
    aten_gm = run_and_compare(m, gm, [torch.randn(3, 5, 16)])
    assert aten.native_layer_norm.default not in {n.target for n in aten_gm.graph.nodes}


def test_softmax_log_softmax_decomposed():
    def f(x):
        return F.softmax(x, -1), F.log_softmax(x, 1), torch.var(x, 0), torch.std(x, -1)

    gm = torch.fx.symbolic_trace(f)
    aten_gm = run_and_compare(f, gm, [torch.randn(4, 7)])
    targets = {n.target for n in aten_gm.graph.nodes}
    assert aten._softmax.default not in targets
    assert aten._log_softmax.default not in targets
    assert aten.amax.default in targets and aten.exp.default in targets


def test_half_precision_softmax_and_layernorm():
    def f(x):
        return F.softmax(x, -1), F.layer_norm(x, (8,))

    gm = torch.fx.symbolic_trace(f)
    run_and_compare(f, gm, [torch.randn(4, 8, dtype=torch.bfloat16)], atol=2e-2, rtol=2e-2)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv1(x)))
        x = F.silu(self.gn(self.conv2(x)))
        return torch.flatten(self.pool(x), 1)


def test_conv_net_eval():
    m = ConvNet().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_()
        m.bn.running_var.uniform_(0.5, 2)
    gm = torch.fx.symbolic_trace(m)
    aten_gm = run_and_compare(m, gm, [torch.randn(2, 3, 10, 10)])
    targets = {n.target for n in aten_gm.graph.nodes}
    assert aten.convolution.default in targets
    assert not any("batch_norm" in str(t) or "group_norm" in str(t) for t in targets)


def _graph_calling(mod: nn.Module) -> torch.fx.Graph:
    # BatchNorm checks input.dim() in Python, which symbolic_trace cannot do: call F.batch_norm
    g = torch.fx.Graph()
    x = g.placeholder("x")
    attrs = {n: g.get_attr(n) for n in ("running_mean", "running_var", "weight", "bias")}
    g.call_function(operator.iadd, (g.get_attr("num_batches_tracked"), 1))
    out = g.call_function(
        F.batch_norm,
        (x, attrs["running_mean"], attrs["running_var"], attrs["weight"], attrs["bias"]),
        {"training": True, "momentum": mod.momentum, "eps": mod.eps},
    )
    g.output(out)
    return g


def test_batchnorm_training_mode_updates_running_stats_exactly():
    # under no_grad a train-mode BatchNorm still mutates its buffers: write-backs to get_attr
    m = nn.BatchNorm1d(4).train()
    gm = torch.fx.GraphModule(m, _graph_calling(m))
    x = torch.randn(8, 4)
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    info = aten_gm.meta["kiln"]
    assert set(info.mutated_attrs) >= {"running_mean", "running_var", "num_batches_tracked"}
    ref = nn.BatchNorm1d(4).train()
    out = aten_gm(x)[0]
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)
    assert int(m.num_batches_tracked) == 1


def test_attention_kept_whole():
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    gm = torch.fx.symbolic_trace(f)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    aten_gm = run_and_compare(f, gm, [q, k, v])
    targets = {n.target for n in aten_gm.graph.nodes}
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in targets


def test_matmul_family():
    def f(a, b, c):
        return a @ b, torch.bmm(c, c.transpose(1, 2)), torch.matmul(c, b)

    gm = torch.fx.symbolic_trace(f)
    aten_gm = run_and_compare(f, gm, [torch.randn(3, 4), torch.randn(4, 5), torch.randn(2, 3, 4)])
    targets = {n.target for n in aten_gm.graph.nodes}
    assert aten.mm.default in targets and aten.bmm.default in targets


def test_tensor_constant_inside_program():
    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0]) + torch.ones(3)

    gm = torch.fx.symbolic_trace(f)
    run_and_compare(f, gm, [torch.randn(2, 3)])


def test_hand_built_graph():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    a = g.call_function(torch.add, (x, y))
    b = g.call_method("relu", (a,))
    c = g.call_function(torch.sum, (b,), {"dim": 1})
    g.output((b, c))
    gm = torch.fx.GraphModule(nn.Module(), g)

    def eager(x, y):
        b = torch.relu(x + y)
        return b, b.sum(1)

    aten_gm = run_and_compare(eager, gm, [torch.randn(3, 4), torch.randn(3, 4)])
    # the caller's placeholder names are kept
    assert [n.name for n in aten_gm.graph.nodes if n.op == "placeholder"] == ["x", "y"]


def test_hand_built_graph_with_grad_mode_nodes():
    # frontend graphs carry torch.no_grad regions as _set_grad_enabled calls
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.call_function(torch._C._set_grad_enabled, (False,))
    a = g.call_function(torch.mul, (x, 2))
    g.call_function(torch._C._set_grad_enabled, (True,))
    b = g.call_function(torch.sin, (a,))
    g.output((b,))
    gm = torch.fx.GraphModule(nn.Module(), g)
    before = torch.is_grad_enabled()
    aten_gm = run_and_compare(lambda x: (torch.sin(x * 2),), gm, [torch.randn(5)])
    assert torch.is_grad_enabled() == before
    assert not any(n.target is torch._C._set_grad_enabled for n in aten_gm.graph.nodes)


def test_no_grad_region_in_module():
    class M(nn.Module):
        def forward(self, x):
            with torch.no_grad():
                y = x * 3
            return y + x

    m = M()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(4, requires_grad=True)
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    with torch.no_grad():
        torch.testing.assert_close(aten_gm(x)[0], m(x))


def test_requires_grad_inputs_traced_as_inference():
    m = MLP().eval()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(2, 8, requires_grad=True)
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    with torch.no_grad():
        torch.testing.assert_close(aten_gm(x)[0], m(x))


# ------------------------------------------------------------------ outputs and inputs


def test_non_tuple_output_and_constants_in_output():
    def single(x):
        return x.exp()

    gm = torch.fx.symbolic_trace(single)
    aten_gm = run_and_compare(single, gm, [torch.randn(3)])
    assert aten_gm.meta["kiln"].out_spec.num_leaves == 1

    def nested(x):
        return {"a": x + 1, "b": [x * 2, None, 7]}

    gm = torch.fx.symbolic_trace(nested)
    aten_gm = run_and_compare(nested, gm, [torch.randn(3)])
    assert len(aten_gm.graph.output_node().args[0]) == 2


def test_output_aliasing_input():
    def f(x):
        return x, x.view(-1), x.t()

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(3, 4)
    aten_gm = run_and_compare(f, gm, [x])
    # the ATen graph keeps views as view ops; run eagerly they still alias the input
    out = aten_gm(x)
    assert out[0] is x
    assert out[1].data_ptr() == x.data_ptr()


def test_int_and_none_inputs():
    def f(x, n, c, unused):
        return x * n + c

    gm = torch.fx.symbolic_trace(f)
    aten_gm = run_and_compare(f, gm, [torch.randn(3), 3, 0.5, None])
    # static ints are baked in, but the graph keeps the caller's signature
    assert len([n for n in aten_gm.graph.nodes if n.op == "placeholder"]) == 4


# ------------------------------------------------------------------ mutations


def test_input_mutation_made_explicit_and_exact():
    def f(x, y):
        x.add_(1)
        return x * y

    gm = torch.fx.symbolic_trace(f)
    aten_gm = run_and_compare(f, gm, [torch.randn(4), torch.randn(4)])
    nodes = list(aten_gm.graph.nodes)
    copies = [n for n in nodes if n.target is aten.copy_.default]
    assert len(copies) == 1
    assert copies[0].args[0].op == "placeholder" and copies[0].args[0].name == "x"
    # the write-back comes last, right before the output
    assert nodes.index(copies[0]) == len(nodes) - 2
    assert aten_gm.meta["kiln"].mutated_inputs == [0]
    # nothing else mutates
    assert not any(
        n.target._schema.is_mutable
        for n in nodes
        if isinstance(n.target, torch._ops.OpOverload) and n.target is not aten.copy_.default
    )


def test_mutation_through_a_view_and_index_put():
    def f(x, i):
        x[0].mul_(2)
        x.index_put_((i,), torch.tensor(5.0))
        return x.sum()

    gm = torch.fx.symbolic_trace(f)
    run_and_compare(f, gm, [torch.randn(4, 3), torch.tensor([2, 3])])


def test_input_that_is_a_view_mutated():
    def f(x):
        x.mul_(3)
        return x + 1

    gm = torch.fx.symbolic_trace(f)
    base = torch.randn(5, 4)
    x = base[1:3]  # a view of base with a storage offset
    aten_gm = trace_inference(gm, [base.clone()[1:3]])
    assert_aten_graph(aten_gm)
    expected_base = base.clone()
    expected = f(expected_base[1:3])
    got = aten_gm(x)
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(base, expected_base)


def test_aliased_mutated_inputs_refused():
    def f(x, y):
        x.add_(1)
        return y * 2

    gm = torch.fx.symbolic_trace(f)
    base = torch.randn(4)
    with pytest.raises(AliasedInputMutationError):
        trace_inference(gm, [base, base[1:]])


def test_buffer_mutation_written_back():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            return x + self.count

    m = Counter()
    g = torch.fx.Graph()  # symbolic_trace drops the unused add_ node: build it by hand
    x = g.placeholder("x")
    count = g.get_attr("count")
    g.call_method("add_", (count, 1))
    g.output(g.call_function(operator.add, (x, count)))
    gm = torch.fx.GraphModule(m, g)
    x = torch.randn(3)
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    assert aten_gm.meta["kiln"].mutated_attrs == ["count"]
    assert aten_gm.count is m.count
    torch.testing.assert_close(aten_gm(x)[0], x + 1)
    torch.testing.assert_close(aten_gm(x)[0], x + 2)
    assert float(m.count) == 2.0


# ------------------------------------------------------------------ dynamic sizes


class SequentialShapeEnv(ShapeEnv):
    """Symbols numbered in order of creation: s0, s1, ... (torch numbers them by a hash of
    their source name)."""

    def _generate_unique_id(self, source_name: str) -> int:
        uid = len(self.unique_ids)
        self.unique_ids.add(uid)
        return uid


def symbolic_fakes(*tensors, shape_env=None):
    shape_env = shape_env or SequentialShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    out = []
    for t in tensors:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())
        out.append(mode.from_tensor(t, symbolic_context=ctx))
    return mode, out


def test_dynamic_sizes_stay_symbolic():
    def f(x):
        y = x.sin()
        z = y.cos()
        return y, z

    gm = torch.fx.symbolic_trace(f)
    _, (fx_,) = symbolic_fakes(torch.randn(3, 5))
    aten_gm = trace_inference(gm, [fx_])
    assert_aten_graph(aten_gm)
    (ph,) = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    size = ph.meta["val"].shape
    assert all(isinstance(s, torch.SymInt) for s in size)
    assert [str(s) for s in size] == ["s0", "s1"]
    assert aten_gm.meta["kiln"].symbolic
    printed = aten_gm.print_readable(print_output=False)
    assert "s0" in printed and "s1" in printed
    for shape in [(3, 5), (7, 2), (4, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(aten_gm(x), f(x))


def test_dynamic_sizes_softmax_layernorm_view():
    def f(x, y):
        a = F.softmax(x, -1) + y.sum()
        return a, F.layer_norm(x, x.shape[-1:]), x.reshape(-1), torch.var(x, 1)

    gm = torch.fx.symbolic_trace(f)
    _, fakes = symbolic_fakes(torch.randn(3, 5), torch.randn(7))
    aten_gm = trace_inference(gm, fakes)
    assert_aten_graph(aten_gm)
    printed = aten_gm.print_readable(print_output=False)
    assert "s0" in printed and "s1" in printed and "s2" in printed
    out = [n for n in aten_gm.graph.nodes if n.op == "output"][0]
    assert str(out.meta["val"][2].shape[0]) == "s0*s1"
    for xs, ys in [((3, 5), (7,)), ((6, 9), (2,))]:
        x, y = torch.randn(xs), torch.randn(ys)
        torch.testing.assert_close(aten_gm(x, y), f(x, y))


def test_dynamic_symint_input_and_module():
    m = MLP().eval()
    gm = torch.fx.symbolic_trace(m)
    _, (x,) = symbolic_fakes(torch.randn(5, 8))
    # only the batch dim is dynamic in practice; here both are symbolic and the trace
    # specializes the feature dim to 8 through the Linear's weight
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    # parameters keep static sizes
    w = [n for n in aten_gm.graph.nodes if n.op == "get_attr"][0]
    assert all(isinstance(s, int) for s in w.meta["val"].shape)
    for b in (1, 5, 11):
        x = torch.randn(b, 8)
        torch.testing.assert_close(aten_gm(x)[0], m(x))


def test_symint_example_input():
    def f(x, n):
        return x.view(n, -1) * 2

    gm = torch.fx.symbolic_trace(f)
    env = SequentialShapeEnv()
    mode, (fx_,) = symbolic_fakes(torch.randn(4, 6), shape_env=env)
    n = fx_.shape[0]  # a SymInt input, as the frontend passes for size arguments
    aten_gm = trace_inference(gm, [fx_, n])
    assert_aten_graph(aten_gm)
    phs = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(phs[1].meta["val"], torch.SymInt)
    x = torch.randn(4, 6)
    torch.testing.assert_close(aten_gm(x, 4)[0], f(x, 4))


def test_frontend_style_graph_with_fake_example_values():
    # a frontend graph: placeholders carry meta["example_value"]; inputs are symbolic fakes
    def f(x, y):
        return (torch.relu(x) @ y,)

    gm = torch.fx.symbolic_trace(f)
    mode, fakes = symbolic_fakes(torch.randn(3, 4), torch.randn(4, 2))
    for ph, v in zip([n for n in gm.graph.nodes if n.op == "placeholder"], fakes, strict=True):
        ph.meta["example_value"] = v
    aten_gm = trace_inference(gm, fakes)
    assert_aten_graph(aten_gm)
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(aten_gm(x, y), f(x, y))


def test_real_inputs_with_symbolic_example_values_trace_symbolically():
    # torch.compile passes real example inputs and marks dynamic sizes on the placeholders
    def f(x):
        return (x.exp() * 2,)

    gm = torch.fx.symbolic_trace(f)
    _, (fake,) = symbolic_fakes(torch.randn(3, 4))
    (ph,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ph.meta["example_value"] = fake
    aten_gm = trace_inference(gm, [torch.randn(3, 4)])
    assert aten_gm.meta["kiln"].symbolic
    x = torch.randn(5, 2)
    torch.testing.assert_close(aten_gm(x), f(x))


def test_dynamic_3d_linear_with_bias_stays_symbolic():
    # F.linear's C++ path for 3-D inputs reads concrete sizes under functionalize; kiln's
    # function rule keeps batch and sequence dims symbolic (no ShapeEnv replacement)
    m = nn.Linear(8, 4).eval()
    gm = torch.fx.symbolic_trace(m)
    env = SequentialShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
    )
    x = mode.from_tensor(torch.randn(2, 10, 8), symbolic_context=ctx)
    aten_gm = trace_inference(gm, [x])
    assert_aten_graph(aten_gm)
    assert not env.replacements, env.replacements
    out = [n for n in aten_gm.graph.nodes if n.op == "output"][0]
    assert [str(s) for s in out.meta["val"][0].shape] == ["s0", "s1", "4"]
    assert aten.addmm.default in {n.target for n in aten_gm.graph.nodes}
    for shape in [(2, 10, 8), (3, 7, 8), (1, 1, 8)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(aten_gm(x)[0], m(x))
