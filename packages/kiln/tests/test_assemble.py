"""One path from graph to callable: a fresh compile and a graph-cache hit both end in
``kiln.assemble.assemble``, so both get the first-launch interpreter fallback, the profiler's
eager comparison and the same weight guards (before, a hit rebuilt its callable in
``kiln.cache._rebuild``/``_finish`` without the first two, and its guard wrapped another
layer)."""

from __future__ import annotations

import logging
import pickle

import kiln
import kiln.assemble
import kiln.cache
import kiln.graph_to_callable
import kiln.stages
import kiln_runtime
import pytest
import torch
from _nets import ConvNormFc
from kiln.artifact import Artifact
from kiln_runtime import profile
from kiln_runtime.guards import WeightsGuard
from torch import nn

pytestmark = pytest.mark.usefixtures("graph_cache_on")


def Net():
    """A conv with a BatchNorm folded into it (constants computed from weights), a linear
    whose bias the graph reads in place."""
    return ConvNormFc(8)


X = torch.randn(2, 3, 6, 6)


def _net() -> nn.Module:
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        m.norm.running_var.uniform_(0.5, 1.5)
    return m


def _compile(m):
    with torch.no_grad():
        compiled = kiln.backend.kiln_backend(torch.fx.symbolic_trace(m), [X])
    kiln.cache.flush()
    return compiled


@pytest.fixture
def assembled(monkeypatch):
    """Every Artifact ``kiln.assemble.assemble`` turns into a callable, in order."""
    seen: list[Artifact] = []
    real = kiln.assemble.assemble

    def recording(artifact, binding):
        seen.append(artifact)
        return real(artifact, binding)

    monkeypatch.setattr(kiln.graph_to_callable, "assemble", recording)
    return seen


def test_a_miss_and_a_hit_end_in_the_same_assemble(assembled):
    m = _net()
    hits = kiln.stats().graph_cache_hits  # earlier tests in this process may have hit too
    first, second = _compile(m), _compile(m)
    assert kiln.stats().graph_cache_hits == hits + 1
    fresh, hit = assembled
    assert fresh.local is not None and hit.local is None  # a hit derives what it lacks
    assert fresh.wrapper_source == hit.wrapper_source
    assert fresh.constants.keys() == hit.constants.keys() and fresh.guards == hit.guards
    with torch.no_grad():
        for compiled in (first, second):
            torch.testing.assert_close(compiled(X), m(X))


def test_an_artifact_pickles_without_this_processs_values_and_prints(assembled):
    _compile(_net())
    (artifact,) = assembled
    again = pickle.loads(pickle.dumps(artifact))
    assert again.local is None and again.wrapper_source == artifact.wrapper_source
    text = str(artifact)
    assert "folded" in text and "kernel" in text and "guards:" in text and "def call" in text


def _guarded(fn) -> tuple[set, set, set]:
    assert isinstance(fn, WeightsGuard), fn
    return ({id(t) for t in fn.tensors}, {id(t) for t in fn.views}, {id(m) for m in fn.modules})


def test_weight_guards_are_the_same_on_a_miss_and_a_hit():
    m = _net()
    fresh, hit = _compile(m), _compile(m)
    assert kiln.stats().graph_cache_hits >= 1
    assert _guarded(fresh) == _guarded(hit)
    tensors, views, modules = _guarded(hit)
    assert {id(m.conv.weight), id(m.norm.running_var), id(m.norm.weight)} <= tensors
    assert id(m.fc.bias) in views and id(m.norm) in modules
    with torch.no_grad():
        m.norm.running_mean.add_(0.25)  # the folded constants are stale: both compile again
        for compiled in (fresh, hit):
            before = compiled.fn
            torch.testing.assert_close(compiled(X), m(X))
            # it runs the new compile, and guards it itself (one guard, not a chain)
            assert compiled.fn is not before and type(compiled.fn) is not WeightsGuard
            assert _guarded(compiled)[0] == tensors


class _LaunchFailed(Exception):
    pass


@pytest.mark.parametrize("path", ["miss", "hit"])
def test_a_kernel_that_fails_at_first_launch_runs_on_the_interpreter(path, monkeypatch, caplog):
    m = _net()
    if path == "hit":
        _compile(m)
    monkeypatch.setattr(kiln.stages, "compile_errors", lambda: (_LaunchFailed,))
    real_load = kiln_runtime.load

    def load_failing_at_first_launch(module, config=None):
        graph = real_load(module, config)

        def call(args):
            args.clear()  # as a generated wrapper does, before a launch fails
            raise _LaunchFailed("kernel k did not compile")

        graph.call = call
        return graph

    monkeypatch.setattr(kiln_runtime, "load", load_failing_at_first_launch)
    before = kiln.stats()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        compiled = _compile(m)
        assert kiln.stats().graph_cache_hits == before.graph_cache_hits + (path == "hit")
        with torch.no_grad():
            torch.testing.assert_close(compiled(X), m(X))
            torch.testing.assert_close(compiled(X), m(X))
    assert sum("loopir interpreter instead" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("path", ["miss", "hit"])
def test_the_profiler_compares_with_eager_on_a_miss_and_a_hit(path, monkeypatch):
    m = _net()
    if path == "hit":
        _compile(m)
    monkeypatch.setenv("KILN_LOGS", "perf")
    profile.reset()
    compiled = _compile(m)
    with torch.no_grad():
        for _ in range(2):  # the first call warms up, uncounted
            torch.testing.assert_close(compiled(X), m(X))
    (prof,) = profile.profiles()
    assert prof.calls == 1 and prof.eager_calls == 1  # the ATen graph ran beside it
    assert any(s.kind == "extern" and s.index in prof.extern_match for s in prof.steps)
    profile.reset()
