"""kiln-frontend capture on real models (random weights, no downloads).

Each model is captured with ``fullgraph=True`` into ONE graph and compared with eager:
* eval mode under ``torch.no_grad()`` (a second call reuses the cache entry);
* train mode with gradients (dropout off through the configs), outputs and every
  parameter's gradient compared with eager.

timm models need the torchvision shim (conftest.py installs it; docs/testing.md)."""

from __future__ import annotations

import copy
import dataclasses

import kiln_frontend
import pytest
import torch
from kiln_frontend import eval_frame

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


class CountingBackend:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


# -- models ------------------------------------------------------------------------------


def _timm(name, **kw):
    def build():
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, **kw)
        size = kw.get("img_size", 64)
        return model, (torch.randn(2, 3, size, size),), {}

    return build


def _hf(kind):
    def build():
        torch.manual_seed(0)
        T = transformers
        if kind == "bert":
            cfg = T.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=128,
                               max_position_embeddings=64, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
            model = T.BertModel(cfg)
        elif kind == "gpt2":
            cfg = T.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=2, n_positions=64,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                               bos_token_id=0, eos_token_id=1)
            model = T.GPT2LMHeadModel(cfg)
        elif kind == "t5":
            cfg = T.T5Config(vocab_size=128, d_model=64, d_kv=32, d_ff=128, num_layers=2,
                             num_decoder_layers=2, num_heads=2, dropout_rate=0.0,
                             decoder_start_token_id=0)
            model = T.T5Model(cfg)
            ids = torch.randint(0, 128, (2, 16))
            return model, (ids,), {"decoder_input_ids": ids[:, :8].clone()}
        else:
            cfg = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=64,
                                attention_dropout=0.0)
            model = T.LlamaForCausalLM(cfg)
        ids = torch.randint(0, 128, (2, 16))
        return model, (ids,), {"attention_mask": torch.ones(2, 16, dtype=torch.long)}

    return build


MODELS = {
    "resnet18": _timm("resnet18"),
    "bert": _hf("bert"),
    "gpt2": _hf("gpt2"),
    "llama": _hf("llama"),
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224", img_size=64),
    "mobilenetv3_small_100": _timm("mobilenetv3_small_100"),
}


# -- comparing ------------------------------------------------------------------------------


def assert_same(actual, expected, what="output", **tol):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)
        return
    assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):  # transformers' ModelOutput is an OrderedDict
        assert list(actual.keys()) == list(expected.keys()), what
        for k in expected:
            assert_same(actual[k], expected[k], f"{what}[{k!r}]", **tol)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{what}[{i}]", **tol)
    elif dataclasses.is_dataclass(expected) or hasattr(expected, "__dict__"):
        assert_same(vars(actual), vars(expected), f"{what}.__dict__", **tol)
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    return next(v for v in out if isinstance(v, torch.Tensor))


@pytest.fixture(autouse=True)
def _fresh():
    kiln_frontend.reset()
    yield
    kiln_frontend.reset()


@pytest.mark.parametrize("name", list(MODELS))
def test_eval_no_grad_one_graph(name):
    model, args, kwargs = MODELS[name]()
    model.eval()
    backend = CountingBackend()
    compiled = kiln_frontend.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        actual = compiled(*args, **kwargs)
        assert len(backend.graphs) == 1
        assert_same(actual, expected, atol=1e-5, rtol=1e-4)
        converts = eval_frame.counters["converts"]
        again = compiled(*args, **kwargs)
    assert_same(again, expected, atol=1e-5, rtol=1e-4)
    assert len(backend.graphs) == 1 and eval_frame.counters["converts"] == converts
    gm = backend.graphs[0]
    # parameters are graph attributes held by the root: the model's own tensors
    params = {id(p) for p in model.parameters()}
    held = [t for t in list(gm.parameters()) + list(gm.buffers())]
    assert held and all(id(t) in params or not isinstance(t, torch.nn.Parameter)
                        for t in held)


@pytest.mark.parametrize("name", list(MODELS))
def test_train_grads_match_eager(name):
    model, args, kwargs = MODELS[name]()
    model.train()
    eager_model = copy.deepcopy(model)
    backend = CountingBackend()
    compiled = kiln_frontend.optimize(backend, nopython=True)(model)

    expected = eager_model(*args, **kwargs)
    _first_tensor(expected).float().pow(2).mean().backward()
    actual = compiled(*args, **kwargs)
    _first_tensor(actual).float().pow(2).mean().backward()

    assert len(backend.graphs) == 1
    assert_same(actual, expected, atol=1e-5, rtol=1e-4)
    for (n, p), (_, q) in zip(model.named_parameters(), eager_model.named_parameters(),
                              strict=True):
        if q.grad is None:
            assert p.grad is None, n
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=n: f"grad of {n}: {m}")
    # running statistics (BatchNorm in train mode) advanced the same way
    for (n, b), (_, c) in zip(model.named_buffers(), eager_model.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=lambda m, n=n: f"buffer {n}: {m}")


#: encoder-only, decoder-only and encoder-decoder: each must reuse its cache entries
NO_RECOMPILE_MODELS = {**MODELS, "t5": _hf("t5")}


@pytest.mark.parametrize("name", list(NO_RECOMPILE_MODELS))
def test_no_recompiles_on_repeated_calls(name):
    """Five calls with the same inputs: everything compiles on the first one, and no guard
    fails afterwards (a guard that can never pass, such as an identity guard on a bound
    method, recompiled transformers BERT on every call).  Not fullgraph: a frame behind a
    graph break is checked too."""
    model, args, kwargs = NO_RECOMPILE_MODELS[name]()
    model.eval()
    compiled = kiln_frontend.compile(model, backend=CountingBackend())
    with torch.no_grad():
        expected = model(*args, **kwargs)
        assert_same(compiled(*args, **kwargs), expected, atol=1e-5, rtol=1e-4)
        counters = eval_frame.counters
        assert counters["compiles"] >= 1, "nothing was compiled"
        assert counters["internal_errors"] == 0
        # (a frame may legitimately compile twice within the first call: T5 sets
        # attributes of two config classes through one closure-made __setattr__)
        after_first = {k: counters[k] for k in ("converts", "compiles", "recompiles",
                                                "cache_limit", "internal_errors")}
        for _ in range(4):
            assert_same(compiled(*args, **kwargs), expected, atol=1e-5, rtol=1e-4)
    assert {k: counters[k] for k in after_first} == after_first
