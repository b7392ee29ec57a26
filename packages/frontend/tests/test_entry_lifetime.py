"""A dropped model is freed: the globals capture installs go with the last cache entry whose
code reads them, and an entry goes when an object its guards fix by identity dies
(entry_lifetime.py).

Each test runs its compiled code in globals of its own (a fresh module dict), so what
capture installs there, and what is left after, is this test's alone.
"""

from __future__ import annotations

import gc
import types
import weakref

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend.eval_frame import cache_entries

pytestmark = pytest.mark.usefixtures("fresh_frontend")

_SOURCE = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.rand(4))

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale + BIAS


def apply(m, x):
    y = m(x)
    if y.sum() > 0:           # data-dependent: a graph break and a resume function
        return y * 2
    return y - 1


def apply_twice(m, x):
    with torch.no_grad():     # a graph break inside a grad-mode block: a re-entry function
        y = m(x)
        if y.sum() > 0:
            y = y * 2
    return y + 1


BIAS = torch.ones(4)
'''


def _user_module():
    """A module of its own for each test: what capture installs in its globals is the
    test's alone."""
    mod = types.ModuleType(f"_lifetime_user_{id(object())}")
    exec(compile(_SOURCE, f"<{mod.__name__}>", "exec"), mod.__dict__)
    return mod


def _kiln_names(globals_):
    return sorted(n for n in globals_ if n.startswith(("__compiled_fn", "___kiln_",
                                                        "__resume_at", "__kiln_reenter")))


def _call(compiled, *args):
    with torch.no_grad():
        return compiled(*args)


def test_reset_frees_a_dropped_model_and_its_globals():
    mod = _user_module()
    model = mod.Net()
    compiled = kiln_frontend.optimize(CountingBackend())(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(_call(compiled, x), _call(model, x))
    assert _kiln_names(mod.__dict__), "capture installs its graph as a global"
    ref = weakref.ref(model)
    del model, compiled
    kiln_frontend.reset()
    gc.collect()
    assert ref() is None, gc.get_referrers(ref()) if ref() is not None else ""
    assert _kiln_names(mod.__dict__) == []
    from kiln_frontend import entry_lifetime

    assert entry_lifetime.installed_names(mod.__dict__) == {}


def test_an_entry_goes_when_the_model_it_guards_dies():
    """No reset: the entry fixed the model by identity; once the model dies, it is dropped
    (a new model at the same address must not pass its id guard) and its globals go."""
    mod = _user_module()
    model = mod.Net()
    compiled = kiln_frontend.optimize(CountingBackend())(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(_call(compiled, x), _call(model, x))
    code = mod.Net.forward.__code__
    assert len(cache_entries(code)) == 1
    ref = weakref.ref(model)
    del model, compiled
    gc.collect()
    assert ref() is None
    assert cache_entries(code) == []
    assert _kiln_names(mod.__dict__) == []
    other = mod.Net()  # and a new model compiles and runs
    torch.testing.assert_close(_call(kiln_frontend.optimize(CountingBackend())(other), x),
                               _call(other, x))


def test_resume_functions_shared_by_entries_stay_while_one_lives():
    """Two entries of one function (two models passed in) share its resume function: when
    one model dies, its entry goes and the other entry still runs (its code loads the
    resume function and its graphs by name); when both are gone, so are the globals."""
    mod = _user_module()
    backend = CountingBackend()
    compiled = kiln_frontend.optimize(backend)(mod.apply)
    a, b = mod.Net(), mod.Net()
    xs = [torch.randn(3, 4), -torch.randn(3, 4).abs() - 10]
    for m in (a, b):
        for x in xs:
            torch.testing.assert_close(_call(compiled, m, x), _call(mod.apply, m, x))
    assert len(cache_entries(mod.apply.__code__)) == 2
    resume_names = [n for n in mod.__dict__ if n.startswith("__resume_at")]
    assert resume_names
    ref_a = weakref.ref(a)
    del a
    gc.collect()
    assert ref_a() is None
    assert len(cache_entries(mod.apply.__code__)) == 1
    for n in resume_names:
        assert n in mod.__dict__, f"{n} is still read by b's entry"
    graphs = len(backend.graphs)
    for x in xs:
        torch.testing.assert_close(_call(compiled, b, x), _call(mod.apply, b, x))
    assert len(backend.graphs) == graphs, "b's entries still run: no recompile"
    c = mod.Net()  # a new model: a recompile that works
    for x in xs:
        torch.testing.assert_close(_call(compiled, c, x), _call(mod.apply, c, x))
    del b, c, m
    gc.collect()
    assert cache_entries(mod.apply.__code__) == []
    assert _kiln_names(mod.__dict__) == []


def test_recompiles_keep_working_after_reset():
    mod = _user_module()
    compiled = kiln_frontend.optimize(CountingBackend())(mod.apply_twice)
    m = mod.Net()
    for shape in ((3, 4), (5, 4), (3, 4)):
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(m, x), mod.apply_twice(m, x))
    kiln_frontend.reset()
    gc.collect()
    assert _kiln_names(mod.__dict__) == []
    for shape in ((3, 4), (5, 4)):
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(m, x), mod.apply_twice(m, x))


def test_names_of_a_capture_that_made_no_entry_are_removed(monkeypatch):
    """A capture that installed globals (graphs, a resume function) but made no entry (here
    the callback drops what it compiled) leaves none behind once it ends."""
    from kiln_frontend import eval_frame
    from kiln_frontend.convert import convert_frame

    made = []

    def convert_then_drop(*args, **kwargs):
        made.append(convert_frame(*args, **kwargs))
        return None

    monkeypatch.setattr(eval_frame, "convert_frame_fn", convert_then_drop)
    mod = _user_module()
    compiled = kiln_frontend.optimize(CountingBackend())(mod.apply)
    m, x = mod.Net(), torch.randn(3, 4)
    torch.testing.assert_close(_call(compiled, m, x), _call(mod.apply, m, x))
    assert made and made[0] is not None and made[0].installed_globals
    assert _kiln_names(mod.__dict__) == []
