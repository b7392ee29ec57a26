"""The root frame of what the user compiles is always captured, even when its code is in
torch's files (``compile(nn.Sequential(...))``), and torch's own Python that it runs is traced
by the rules of ``kiln_frontend.trace_rules``.  A frame that is skipped says why."""

from __future__ import annotations

import inspect

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import config, eval_frame, trace_rules
from kiln_frontend.logging_utils import KilnWarning
from torch import nn


@pytest.fixture(autouse=True)
def _reset():
    kiln_frontend.reset()
    yield
    kiln_frontend.reset()


class ListAndDict(nn.Module):
    """A user module iterating a ModuleList and a ModuleDict (torch containers inside)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()})

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        for _name, head in self.heads.items():
            x = head(x)
        return x


def _encoder():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _seq_input():
    return (torch.randn(2, 4),)


def _tokens(batch_first=True):
    return (torch.randn(2, 3, 8) if batch_first else torch.randn(3, 2, 8),)


def _self_attention():
    x = torch.randn(2, 3, 8)
    return (x, x, x)


def _cross_attention():
    return (torch.randn(3, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8))


#: name -> (module factory, input factory)
ROOT_MODULES = {
    "sequential": (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)),
                   _seq_input),
    "nested_sequential": (lambda: nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.GELU()),
                                                nn.LayerNorm(4)), _seq_input),
    "user_module_with_modulelist_and_moduledict": (ListAndDict, _seq_input),
    "transformer_encoder_layer_fast_path": (
        lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), _tokens),
    "transformer_encoder_layer_python_path": (
        lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
        lambda: _tokens(batch_first=False)),
    "transformer_encoder_modulelist_at_root": (_encoder, _tokens),
    "multihead_attention_self": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                                 _self_attention),
    "multihead_attention_cross": (lambda: nn.MultiheadAttention(8, 2), _cross_attention),
}


@pytest.mark.parametrize("name", sorted(ROOT_MODULES))
def test_torch_module_at_root_compiles_to_one_graph(name):
    make_module, make_inputs = ROOT_MODULES[name]
    torch.manual_seed(0)
    module = make_module().eval()
    args = make_inputs()
    backend = CountingBackend()
    compiled = kiln_frontend.compile(module, backend=backend)
    with torch.no_grad():
        expected = module(*args)
        got = compiled(*args)
        again = compiled(*args)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(again, expected)
    assert len(backend.graphs) == 1, name
    assert eval_frame.counters["compiles"] == 1  # the second call hit the cache
    assert eval_frame.counters["internal_errors"] == 0


def test_sequential_under_fullgraph_and_with_grad():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    backend = CountingBackend()
    compiled = kiln_frontend.compile(seq, backend=backend, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), seq(x))
    assert len(backend.graphs) == 1
    ops = [n.target for n in backend.graphs[0].graph.nodes if n.op == "call_module"]
    assert len(ops) == 3  # the three leaf modules are graph calls


def test_multihead_attention_recompiles_when_query_is_no_longer_key():
    """``query is key`` in torch's attention code is decided while tracing and guarded."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    backend = CountingBackend()
    compiled = kiln_frontend.compile(mha, backend=backend)
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, x, x), mha(x, x, x))
        torch.testing.assert_close(compiled(x, y, y), mha(x, y, y))
        torch.testing.assert_close(compiled(y, y, y), mha(y, y, y))
    assert len(backend.graphs) == 2
    assert eval_frame.counters["recompiles"] == 1


def test_fx_graph_module_at_root_is_captured():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    backend = CountingBackend()
    x = torch.randn(2, 4)
    torch.testing.assert_close(kiln_frontend.compile(gm, backend=backend)(x), gm(x))
    assert len(backend.graphs) == 1


def test_root_code_skipped_earlier_is_captured_again():
    # an FX GraphModule's forward is generated code, made anew by each trace
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()))
    code = type(gm).forward.__code__
    eval_frame.skip_code(code)  # as if a frame of it had been declined before
    assert eval_frame.should_skip(code) == "generated code"
    backend = CountingBackend()
    x = torch.randn(2, 4)
    torch.testing.assert_close(kiln_frontend.compile(gm, backend=backend)(x), gm(x))
    assert len(backend.graphs) == 1
    assert code in eval_frame.capture_roots()
    assert eval_frame.should_skip(code) is None


def test_user_code_root_keeps_its_own_skip_mark():
    def add(x):
        return x + 1

    eval_frame.skip_code(add.__code__)  # e.g. it hit cache_size_limit
    kiln_frontend.compile(add, backend=CountingBackend())
    assert add.__code__ not in eval_frame.capture_roots()
    assert eval_frame.is_skipped(add.__code__)


def test_module_list_at_root_raises_like_eager():
    layers = nn.ModuleList([nn.Linear(4, 4)])
    compiled = kiln_frontend.compile(layers, backend=CountingBackend())
    with pytest.raises(NotImplementedError):
        layers(torch.randn(2, 4))
    with pytest.raises(NotImplementedError):
        compiled(torch.randn(2, 4))
    assert eval_frame.counters["internal_errors"] == 0


def test_generator_function_root_warns():
    def gen(x):
        yield x + 1

    with pytest.warns(KilnWarning, match="generator or coroutine function"):
        compiled = kiln_frontend.compile(gen, backend=CountingBackend())
    assert list(compiled(torch.ones(1))) == [torch.ones(1) + 1]


# -- saying why a frame is skipped ----------------------------------------------------------


def test_explain_lists_skipped_frames_with_reasons():
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    out = kiln_frontend.explain(seq)(torch.randn(2, 4))
    assert out.graph_count == 1 and out.graph_break_count == 0
    by_frame = {f.frame: f for f in out.skipped_frames}
    call_impl = by_frame["Module._call_impl"]
    assert call_impl.reason == "in torch's own files"
    assert call_impl.filename == inspect.getsourcefile(nn.Module)
    assert "Sequential.forward" not in by_frame
    assert "Skipped Frames:\n" in str(out)
    assert "  Module._call_impl (" in str(out)


def test_debug_log_says_which_frame_is_skipped_and_why(capsys):
    seq = nn.Sequential(nn.Linear(4, 4))
    with config.patch(debug=True):
        kiln_frontend.compile(seq, backend=CountingBackend())(torch.randn(2, 4))
    err = capsys.readouterr().err
    assert "[kiln.skips] not capturing Module._call_impl (" in err
    assert "): in torch's own files" in err
    assert "not capturing Sequential.forward" not in err


def test_skip_detail_names_the_reason():
    import json

    assert eval_frame.skip_detail(json.dumps.__code__) == \
        "in the standard library (config.skip_stdlib)"
    assert eval_frame.skip_detail(nn.Module._call_impl.__code__) == "in torch's own files"
    assert eval_frame.skip_detail(eval_frame.reset.__code__) == "in kiln_frontend's own files"
    assert eval_frame.skip_detail(test_skip_detail_names_the_reason.__code__) is None


# -- the trace rules table ------------------------------------------------------------------


def test_trace_rules_decisions():
    Rule = trace_rules.Rule
    assert trace_rules.lookup(torch.nn.functional._canonical_mask).rule is Rule.INLINE
    assert trace_rules.lookup(nn.Linear.forward).rule is Rule.INLINE  # torch.nn.modules
    assert trace_rules.lookup(torch._transformer_encoder_layer_fwd).rule is Rule.GRAPH
    skip = trace_rules.lookup(torch.fx.symbolic_trace)
    assert skip.rule is Rule.SKIP and "not inlined" in skip.why
    assert trace_rules.lookup(test_trace_rules_decisions) is None  # user code
    assert trace_rules.unresolved() == []  # every listed function exists in this torch
    assert trace_rules.torch_module_of_file(nn.modules.linear.__file__) == \
        "torch.nn.modules.linear"


def test_trace_rules_refuse_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        trace_rules.register_module("torch.nn.modules", trace_rules.Rule.SKIP, "again")
    with pytest.raises(ValueError, match="already registered"):
        trace_rules.register_function("torch.nn.functional._canonical_mask",
                                      trace_rules.Rule.SKIP, "again")


def test_torch_internal_call_is_a_graph_break_naming_the_rule():
    def f(x):
        y = x * 2
        torch.fx.symbolic_trace  # noqa: B018 - a load is fine
        z = torch.nn.utils.parameters_to_vector([y])  # torch internals: not inlined
        return z + 1

    out = kiln_frontend.explain(f)(torch.randn(3))
    reasons = [b.reason for b in out.break_reasons]
    assert any("parameters_to_vector (torch internals are not inlined)" in r for r in reasons)
    x = torch.randn(3)
    torch.testing.assert_close(kiln_frontend.compile(f, backend=CountingBackend())(x), f(x))
