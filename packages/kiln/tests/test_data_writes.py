"""A write through ``.data`` after compiling (``p.data.mul_(k)``, an EMA update, a kept
``w = p.data``) must never leave the compiled code computing with the old values.

``p.data`` is a tensor over ``p``'s memory with a version counter of its own: the write
moves no counter of ``p``'s, so the kiln backend's constants computed from ``p`` (a
BatchNorm folded into the conv, an MKL-packed GEMM weight, a folded weight subgraph) would
keep the old values. ``kiln_runtime.data_aliases`` counts ``.data`` takes from the memory of
guarded weights and finds the aliases that exist when a guard is made, and the guard
compiles again (docs/kiln.md). Every test compares ``kiln.compile`` (C++ codegen) with
eager, through the graph cache and without it."""

from __future__ import annotations

import kiln
import pytest
import torch
import torch.nn as nn
from kiln_runtime import data_aliases
from kiln_runtime.guards import WeightsGuard
from test_fold_weight_subgraphs import RelativeProjection
from test_weight_swaps import MLP, XI, ConvBN

X = torch.randn(4, 16)
XR = torch.randn(3, 16)


@pytest.fixture(scope="module")
def _shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kiln_cache")


@pytest.fixture(autouse=True, params=["graph_cache", "no_graph_cache"])
def fresh(request, monkeypatch, _shared_cache, needs_cpp):
    monkeypatch.setenv("KILN_CACHE_DIR", str(_shared_cache))
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1" if request.param == "graph_cache" else "0")
    kiln.reset()
    yield
    kiln.reset()


def _model(cls):
    torch.manual_seed(0)
    return cls().eval()


#: (model class, input, the weights constants are computed from)
MODELS = {
    "packed_linear": (MLP, X, ["fc1.weight", "fc1.bias"]),
    "folded_batchnorm": (ConvBN, XI, ["conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var"]),
    "folded_subgraph": (RelativeProjection, XR, ["table", "pos_proj.weight", "scale"]),
}
CASES = [(kind, name) for kind, (_, _, names) in MODELS.items() for name in names]
FIRSTS = [(kind, names[0]) for kind, (_, _, names) in MODELS.items()]


def _tensor(model, name):
    return model.get_parameter(name) if name in dict(model.named_parameters()) \
        else model.get_buffer(name)


#: ways to write a weight through memory its version counter does not follow
WRITES = {
    "data_mul": lambda t: t.data.mul_(1.5),
    "data_copy": lambda t: t.data.copy_(torch.rand_like(t) + 0.5),
    "data_row": lambda t: t.data[0].add_(1.0),
    "row_data": lambda t: t[0].data.add_(1.0),
    "detach_data": lambda t: t.detach().data.mul_(0.5),
}


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _write_and_compare(kind, name, write):
    cls, x, _ = MODELS[kind]
    model = _model(cls)
    compiled = kiln.compile(model)
    with torch.no_grad():
        _close(compiled(x), model(x))
        WRITES[write](_tensor(model, name))
        _close(compiled(x), model(x))
        WRITES[write](_tensor(model, name))  # and again, after the recompile
        _close(compiled(x), model(x))


@pytest.mark.parametrize("kind,name", CASES)
def test_data_mul_on_each_weight_constants_come_from(kind, name):
    _write_and_compare(kind, name, "data_mul")


@pytest.mark.parametrize("write", sorted(set(WRITES) - {"data_mul"}))
@pytest.mark.parametrize("kind,name", FIRSTS)
def test_each_way_to_write_through_data(kind, name, write):
    _write_and_compare(kind, name, write)


@pytest.mark.parametrize("kind,name", FIRSTS)
def test_alias_kept_from_before_compiling(kind, name):
    cls, x, _ = MODELS[kind]
    model = _model(cls)
    alias = _tensor(model, name).data  # taken before kiln watches anything
    compiled = kiln.compile(model)
    with torch.no_grad():
        _close(compiled(x), model(x))
        alias.mul_(1.5)
        _close(compiled(x), model(x))
        alias.add_(0.25)
        _close(compiled(x), model(x))


def test_alias_kept_across_calls():
    model = _model(MLP)
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(X)
        alias = model.fc1.weight.data  # taken between calls, written later
        _close(compiled(X), model(X))
        alias.mul_(2.0)
        _close(compiled(X), model(X))
        alias[1:3].zero_()  # a view of the alias shares its counter
        _close(compiled(X), model(X))


def test_exponential_moving_average_of_a_teacher():
    student, teacher = _model(ConvBN), _model(ConvBN)
    compiled = kiln.compile(teacher)
    with torch.no_grad():
        for step in range(4):
            for p in student.parameters():
                p.add_(0.1 * (step + 1))
            for t, s in zip(teacher.state_dict().values(), student.state_dict().values(), strict=True):
                if t.is_floating_point():
                    t.data.mul_(0.5).add_(s.data, alpha=0.5)  # timm-style, through .data
            _close(compiled(XI), teacher(XI))


def test_recompiles_keep_one_guard():
    # each write compiles again; the guard adopts the new compile's state instead of
    # wrapping a new guard (a chain would grow each call by one frame per write)
    model = _model(MLP)
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(X)
        for _ in range(3):
            model.fc1.weight.data.mul_(1.1)
            _close(compiled(X), model(X))
    guards = [g for g in _guards_of(model) if g.tensors is not None]
    assert guards and all(type(g.fn) is not WeightsGuard for g in guards)


def _guards_of(model):
    import gc

    return [o for o in gc.get_objects() if type(o) is WeightsGuard
            and any(t is model.fc1.weight for t in (o.tensors or ()))]


def test_takes_count_any_tensor_over_the_memory():
    p = nn.Parameter(torch.randn(8, 8))
    kept = p.data
    readers = data_aliases.watch([p])
    assert len(readers) == 1 and readers[0] is not kept and torch.equal(readers[0], kept)
    kept.mul_(2.0)
    assert readers[0]._version == kept._version == 1  # the reader shares the counter
    before = data_aliases.takes([p])
    p.data, p[2].data, p.detach().data  # noqa: B018 - each take counts
    assert data_aliases.takes([p]) == before + 3
    torch.randn(3).data  # noqa: B018 - other memory: not counted
    assert data_aliases.takes([p]) == before + 3


def test_write_through_data_inside_compiled_code():
    # the frontend runs the .data take in Python (a graph break), so it is counted too
    model = _model(MLP)

    def step(x):
        y = model(x)
        model.fc1.weight.data.mul_(0.9)
        return y + model(x)

    compiled = kiln.compile(step)
    reference = _model(MLP)
    with torch.no_grad():
        for _ in range(3):
            expected = reference(X)
            reference.fc1.weight.mul_(0.9)
            _close(compiled(X), expected + reference(X))
