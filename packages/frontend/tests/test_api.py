"""optimize / compile / run / disable / reset and the Python callback (eval_frame.py).

The capture layer is replaced through the documented seam ``eval_frame.convert_frame_fn``
by ``FakeConvert``: it builds the frame's function again from a copy of its code (taking all
argument slots positionally, like real transformed code) and guards on the arguments' types,
so these tests need no torch unless they use nn.Modules.
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import sysconfig
import threading
import types
import warnings

import kiln_frontend
import pytest
import torch
from _frames import type_guard
from kiln_frontend import _evalframe as C
from kiln_frontend import config, eval_frame
from kiln_frontend.logging_utils import KilnWarning


class FakeCompiled:
    def __init__(self, check_fn, fn):
        self.check_fn = check_fn
        self.fn = fn


class FakeConvert:
    """Stands in for kiln_frontend.convert.convert_frame."""

    def __init__(self, only=None, raises=None):
        self.calls = []  # (code name, kwargs)
        self.files = []  # the offered frames' files
        self.only = only
        self.raises = raises
        self.runs = []

    def __call__(self, frame, *, compiler_fn, nopython, frame_state, **extra):
        name = frame.code.co_name
        self.files.append(frame.code.co_filename)
        self.calls.append((name, dict(compiler_fn=compiler_fn, nopython=nopython,
                                      frame_state=frame_state, **extra)))
        if self.raises is not None:
            raise self.raises
        if self.only is not None and name not in self.only:
            return None
        co = frame.code
        flags = co.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        new_code = co.replace(co_argcount=len(frame.args), co_posonlyargcount=0,
                              co_kwonlyargcount=0, co_flags=flags)
        compiled = types.FunctionType(new_code, frame.globals, name, None, frame.closure)
        C.skip_code(compiled.__code__)
        runs = self.runs

        def fn(*args):
            runs.append(name)
            return compiled(*args)

        check_fn = type_guard(frame.args)
        frame_state["compiles"] = frame_state.get("compiles", 0) + 1
        return FakeCompiled(check_fn, fn)

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def fake(monkeypatch):
    conv = FakeConvert()
    monkeypatch.setattr(eval_frame, "convert_frame_fn", conv)
    kiln_frontend.reset()
    yield conv
    kiln_frontend.reset()


@pytest.fixture(autouse=True)
def hook_off_after():
    yield
    assert C.get_eval_frame() is None, "a test left the hook on"


def add(a, b):
    return a + b


def double(x):
    return add(x, x)


# --------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------


def test_optimize_decorator_compiles_once_and_reuses(fake):
    f = kiln_frontend.optimize("eager")(add)
    assert f.__name__ == "add" and f.__wrapped__ is add
    assert [f(i, 1) for i in range(4)] == [1, 2, 3, 4]
    assert fake.names() == ["add"]
    assert fake.runs == ["add"] * 4
    name, kwargs = fake.calls[0]
    assert kwargs["nopython"] is False
    assert kwargs["compiler_fn"] is kiln_frontend.lookup_backend("eager")
    assert kwargs["dynamic"] is None  # automatic dynamic: convert_frame decides per size


def test_optimize_context_manager_and_nested_frames(fake):
    with kiln_frontend.optimize("eager"):
        assert C.get_eval_frame() is not None
        assert double(torch.tensor(3)) == 6
        assert double(torch.tensor(4)) == 8
    assert C.get_eval_frame() is None
    assert fake.names() == ["double", "add"]
    assert add(1, 2) == 3 and fake.names() == ["double", "add"]  # off outside


def test_frames_that_cannot_touch_torch_are_skipped_unless_compiled_root(fake):
    """As torch.compile (has_tensor_in_frame): a frame with no tensor, module or torch
    global is skipped for good without being traced; what the user compiled is always
    traced, whatever it is called with."""
    def plus(a, b):
        return a + b

    def twice(x):
        return plus(x, x)

    with kiln_frontend.optimize("eager"):
        assert twice(3) == 6
        assert twice(torch.tensor(2)) == 4  # skipped for good: still not offered
    assert fake.names() == []
    assert C.is_skipped(twice.__code__) and C.is_skipped(plus.__code__)
    kiln_frontend.reset()
    assert kiln_frontend.optimize("eager")(twice)(3) == 6
    assert fake.names() == ["twice"]


def test_guard_failure_recompiles_and_logs_reason(fake, caplog):
    f = kiln_frontend.optimize("eager")(add)
    f(1, 2)
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        assert f("a", "b") == "ab"
    assert fake.names() == ["add", "add"]
    assert len(C.cache_entries(add.__code__)) == 2
    msgs = [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]
    assert len(msgs) == 1
    assert "Recompiling function add" in msgs[0]
    assert "type of arg 0: expected int, actual str" in msgs[0]
    # frame_state persists across compiles of the same code
    assert fake.calls[0][1]["frame_state"] is fake.calls[1][1]["frame_state"]
    assert fake.calls[1][1]["frame_state"]["compiles"] == 2


def test_log_recompiles_prints(fake, capsys):
    f = kiln_frontend.optimize("eager")(add)
    f(1, 2)
    with config.patch(log_recompiles=True):
        f(1.0, 2.0)
    err = capsys.readouterr().err
    assert "[kiln.recompiles] Recompiling function add" in err
    assert "expected int, actual float" in err


def test_cache_size_limit_warns_once_then_runs_eagerly(fake):
    f = kiln_frontend.optimize("eager")(add)
    with config.patch(cache_size_limit=2):
        f(1, 2)
        f("a", "b")
        with pytest.warns(KilnWarning, match=r"add .* hit config.cache_size_limit \(2\)"):
            assert f(1.0, 2.0) == 3.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert f([1], [2]) == [1, 2]  # no second warning
            assert f(1, 2) == 3
    assert fake.names() == ["add", "add"]
    assert eval_frame.counters["cache_limit"] == 1
    assert C.is_skipped(add.__code__)


def test_skipped_files_are_never_compiled(fake):
    import json

    with kiln_frontend.optimize("eager"):
        json.dumps({"a": 1})  # standard library
        kiln_frontend.list_backends()  # kiln_frontend itself
    # (code exec'd from strings, e.g. namedtuple's generated methods, may still be offered;
    # so may a site's own hooks, e.g. an audit function installed by the environment)
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    frontend = os.path.dirname(kiln_frontend.__file__) + os.sep
    assert [f for f in fake.files if f.startswith((stdlib, frontend))] == []
    assert eval_frame.should_skip(json.dumps.__code__) == "standard library"
    assert eval_frame.should_skip(eval_frame.reset.__code__) == "library code"
    assert eval_frame.should_skip(add.__code__) is None


def test_nopython_propagates_unsupported(fake):
    from kiln_frontend.exc import Unsupported

    fake.raises = Unsupported("data-dependent branch", filename="f.py", lineno=3)
    f = kiln_frontend.optimize("eager", nopython=True)(add)
    with pytest.raises(Unsupported, match="f.py:3: data-dependent branch"):
        f(1, 2)
    assert fake.calls[0][1]["nopython"] is True


def test_unsupported_without_nopython_falls_back(fake):
    from kiln_frontend.exc import Unsupported

    fake.raises = Unsupported("nope")
    f = kiln_frontend.optimize("eager")(add)
    with pytest.warns(KilnWarning, match="failed; it runs eagerly"):
        assert f(1, 2) == 3


def test_backend_failure_warns_once_or_raises(fake):
    from kiln_frontend.exc import BackendCompilerFailed

    fake.raises = BackendCompilerFailed("eager", RuntimeError("boom"))
    f = kiln_frontend.optimize("eager")(add)
    with pytest.warns(KilnWarning, match="backend 'eager' raised RuntimeError: boom"):
        assert f(1, 2) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1, 2) == 3  # eager from now on, no new warning
    kiln_frontend.reset()
    with config.patch(suppress_errors=False):
        with pytest.raises(BackendCompilerFailed):
            f(1, 2)


def test_exceptions_in_user_code_propagate(fake):
    def bad(x):
        raise KeyError(x)

    f = kiln_frontend.optimize("eager")(bad)
    for _ in range(2):
        with pytest.raises(KeyError):
            f(1)
    assert fake.names() == ["bad"]


def test_recursion_under_optimize(fake):
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    f = kiln_frontend.optimize("eager")(fib)
    assert f(15) == 610
    assert fake.names() == ["fib"]


def test_methods_and_bound_methods(fake):
    class A:
        k = 3

        @kiln_frontend.optimize("eager")
        def scaled(self, x):
            return self.k * x

        def plain(self, x):
            return self.k + x

    a = A()
    assert a.scaled(2) == 6 and A().scaled(3) == 9
    g = kiln_frontend.optimize("eager")(a.plain)
    assert g(1) == 4
    assert fake.names() == ["scaled", "plain"]


def test_dynamic_is_passed_to_convert_frame(fake):
    kiln_frontend.optimize("eager", dynamic=True)(add)(1, 2)
    assert fake.calls[0][1]["dynamic"] is True


def test_optimize_rejects_classes_and_bad_backends():
    with pytest.raises(TypeError):
        kiln_frontend.optimize("eager")(int)
    with pytest.raises(kiln_frontend.InvalidBackend):
        kiln_frontend.optimize("no-such-backend")


# --------------------------------------------------------------------------------------
# run, disable, reset, threads
# --------------------------------------------------------------------------------------


def test_run_only_mode_never_compiles(fake):
    kiln_frontend.optimize("eager")(add)(1, 2)
    assert fake.runs == ["add"]
    r = kiln_frontend.run(add)
    assert r(5, 6) == 11 and fake.runs == ["add", "add"]  # cached entry used
    assert r("a", "b") == "ab"  # guard miss: runs as is
    with kiln_frontend.run():
        assert double(2) == 4
    assert fake.names() == ["add"]
    assert not C.is_skipped(double.__code__)


def test_disable_inside_optimize(fake):
    @kiln_frontend.disable
    def off(x):
        return add(x, 1)

    assert off._kiln_disabled
    with kiln_frontend.optimize("eager"):
        assert off(1) == 2
        with kiln_frontend.disable():
            assert C.get_eval_frame() is None
            double(1)
        assert C.get_eval_frame() is not None
    assert fake.names() == ["off"] or fake.names() == []  # the wrapper is skipped, never `add`
    assert "add" not in fake.names() and "double" not in fake.names()


def test_reset_clears_caches_skip_marks_counters(fake):
    f = kiln_frontend.optimize("eager")(add)
    f(1, 2)
    C.skip_code(double.__code__)
    called = []
    eval_frame.on_reset(lambda: called.append(1))
    kiln_frontend.reset()
    assert C.cache_entries(add.__code__) == []
    assert not C.is_skipped(double.__code__)
    assert not eval_frame.counters
    assert called
    f(1, 2)
    assert fake.names() == ["add", "add"]
    assert fake.calls[1][1]["frame_state"] == {"compiles": 1}
    eval_frame._reset_hooks.clear()


def test_threads_do_not_share_the_hook(fake):
    seen = []
    f = kiln_frontend.optimize("eager")(add)

    def worker():
        seen.append(C.get_eval_frame())
        double(1)

    with kiln_frontend.optimize("eager"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen == [None]
    assert "double" not in fake.names()
    results = []
    threads = [threading.Thread(target=lambda k=k: results.append(f(k, k))) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 2, 4, 6]


# --------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------


def options_backend(gm, example_inputs, options=None):
    return gm


def plain_backend(gm, example_inputs):
    return gm


def test_compile_decorator_forms(fake):
    @kiln_frontend.compile(backend="eager")
    def f1(x):
        return x + 1

    @kiln_frontend.compile(backend=plain_backend, fullgraph=True)
    def f2(x):
        return x + 2

    assert f1(1) == 2 and f2(1) == 3
    assert fake.calls[0][1]["nopython"] is False
    assert fake.calls[1][1]["nopython"] is True
    assert fake.calls[1][1]["compiler_fn"] is plain_backend
    g = kiln_frontend.compile(add, backend="eager")
    assert g(2, 3) == 5
    assert kiln_frontend.compile(add, backend="eager", disable=True) is add


def test_compile_default_backend_is_kiln():
    if "kiln" in kiln_frontend.list_backends():
        pytest.skip("the kiln distribution is installed")
    with pytest.raises(kiln_frontend.InvalidBackend, match="pip install kiln"):
        kiln_frontend.compile(add)

    with pytest.raises(kiln_frontend.InvalidBackend):

        @kiln_frontend.compile
        def f(x):
            return x


def test_compile_mode_and_options_reach_backends_that_accept_them(fake):
    g = kiln_frontend.compile(add, backend=options_backend, mode="max-autotune", options={"a": 1})
    g(1, 2)
    compiler_fn = fake.calls[0][1]["compiler_fn"]
    assert compiler_fn.func is options_backend
    assert compiler_fn.keywords == {"options": {"a": 1, "mode": "max-autotune"}}
    g2 = kiln_frontend.compile(double, backend=options_backend, mode="reduce-overhead")
    g2(1)
    assert fake.calls[1][1]["compiler_fn"].keywords == {"options": {"mode": "reduce-overhead"}}


def test_compile_mode_with_backend_without_options_is_an_error():
    with pytest.raises(ValueError, match="backend 'plain_backend' takes no 'options' keyword"):
        kiln_frontend.compile(add, backend=plain_backend, mode="max-autotune")
    with pytest.raises(ValueError, match="'eager' takes no 'options'"):
        kiln_frontend.compile(add, backend="eager", options={"x": 1})


def test_compile_signature_matches_torch_compile():
    torch = pytest.importorskip("torch")
    ours = inspect.signature(kiln_frontend.compile).parameters
    theirs = inspect.signature(torch.compile).parameters
    for name in ("model", "fullgraph", "dynamic", "backend", "mode", "options", "disable"):
        assert name in ours and name in theirs
        assert ours[name].kind == theirs[name].kind
    assert ours["fullgraph"].default is False and ours["dynamic"].default is None


# --------------------------------------------------------------------------------------
# nn.Module
# --------------------------------------------------------------------------------------


def test_optimized_module_wraps_and_forwards(fake):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.scale = 2.0

        def forward(self, x):
            return self.lin(x) * self.scale

        def extra(self):
            return "extra"

    net = Net()
    opt = kiln_frontend.compile(net, backend="eager")
    assert isinstance(opt, torch.nn.Module)
    assert isinstance(opt, kiln_frontend.OptimizedModule)
    assert opt._orig_mod is net
    assert opt.scale == 2.0 and opt.lin is net.lin and opt.extra() == "extra"
    assert list(opt.state_dict()) == ["lin.weight", "lin.bias"]
    opt.load_state_dict({k: torch.zeros_like(v) for k, v in net.state_dict().items()})
    assert torch.count_nonzero(net.lin.weight) == 0
    x = torch.randn(4, 3)
    torch.testing.assert_close(opt(x), net(x))
    assert "forward" in fake.names()  # the user's forward was captured
    assert all("torch" not in n for n in fake.names())
    assert C.get_eval_frame() is None
    opt.train(False)
    assert not net.training
    assert set(dir(net)) <= set(dir(opt))


def test_optimize_module_context_and_disable_module(fake):
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(2, 2)
    assert type(kiln_frontend.optimize("eager")(lin)).__name__ == "OptimizedModule"
    off = kiln_frontend.disable(lin)
    off(torch.randn(1, 2))
    assert fake.names() == []


# --------------------------------------------------------------------------------------
# config and package surface
# --------------------------------------------------------------------------------------


def test_config_from_environment():
    code = (
        "from kiln_frontend import config as c;"
        "print(c.debug, c.log_recompiles, c.cache_size_limit, c.suppress_errors, c.verbose)"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env = dict(base, KILN_DEBUG="1", KILN_LOGS="+recompiles,guards", KILN_CACHE_SIZE_LIMIT="3",
               KILN_SUPPRESS_ERRORS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True", "3", "False", "False"]
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False", "8", "True", "False"]


def test_config_patch_and_get_config():
    assert config.cache_size_limit == config.get_config()["cache_size_limit"]
    with config.patch(cache_size_limit=1, debug=True):
        assert config.cache_size_limit == 1 and config.debug
    with pytest.raises(AttributeError):
        with config.patch(no_such_flag=1):
            pass


def test_package_exports():
    for name in ("optimize", "compile", "run", "disable", "reset", "list_backends",
                 "register_backend", "lookup_backend", "config", "Unsupported"):
        assert hasattr(kiln_frontend, name), name
    from kiln_frontend.exc import Unsupported

    assert kiln_frontend.Unsupported is Unsupported
    with pytest.raises(AttributeError):
        kiln_frontend.no_such_name  # noqa: B018


def test_import_needs_no_torch():
    code = (
        "import sys; import kiln_frontend, kiln_frontend.eval_frame, kiln_frontend.api;"
        "kiln_frontend.optimize('eager'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_each_backend_gets_its_own_compiled_code():
    """A cache entry compiled for one backend is never run by a call that asked for another
    (BACKEND_MATCH); the same backend and options share entries."""
    torch = pytest.importorskip("torch")
    seen = {"a": 0, "b": 0}

    def make_backend(name):
        def backend(gm, example_inputs):
            seen[name] += 1
            return gm.forward

        return backend

    backend_a, backend_b = make_backend("a"), make_backend("b")

    def f(x):
        return x.sin() + 1

    x = torch.randn(3)
    kiln_frontend.reset()
    torch.testing.assert_close(kiln_frontend.optimize(backend_a)(f)(x), f(x))
    torch.testing.assert_close(kiln_frontend.optimize(backend_b)(f)(x), f(x))
    assert seen == {"a": 1, "b": 1}
    kiln_frontend.optimize(backend_a)(f)(x)  # a second wrapper with the same backend: cache hit
    kiln_frontend.compile(f, backend=backend_b)(x)
    assert seen == {"a": 1, "b": 1}
    kiln_frontend.compile(f, backend=backend_b, fullgraph=True)(x)  # fullgraph compiles its own
    assert seen == {"a": 1, "b": 2}


def test_calls_under_a_torch_func_transform_run_as_python_and_compile_later():
    """vmap/grad over a compiled function: those calls run as plain Python (kiln does not
    capture BatchedTensors), with eager's results and no "compile failed" warning; the code is
    not marked skip, so the next plain call still compiles."""
    torch = pytest.importorskip("torch")
    from _counting_backend import CountingBackend

    backend = CountingBackend()
    kiln_frontend.reset()

    def f(a):
        return (a.sin() * 2).sum()

    compiled = kiln_frontend.compile(f, backend=backend)
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        torch.testing.assert_close(torch.vmap(compiled)(x), torch.vmap(f)(x))
        torch.testing.assert_close(torch.func.grad(compiled)(x[0]), torch.func.grad(f)(x[0]))
    assert backend.graphs == []
    torch.testing.assert_close(compiled(x), f(x))
    assert len(backend.graphs) == 1


def test_torch_compiler_disable_is_honoured():
    """A function the user marked ``@torch.compiler.disable`` (for torch.compile) runs as
    plain Python under kiln too, with what it calls; the code around it still compiles."""
    torch = pytest.importorskip("torch")
    from _counting_backend import CountingBackend

    def helper(x):
        return x.cos() + 1

    @torch.compiler.disable
    def disabled(x):
        return helper(x) * 3

    def f(x):
        return disabled(x.sin()) - 1

    kiln_frontend.reset()
    backend = CountingBackend()
    x = torch.randn(4)
    torch.testing.assert_close(kiln_frontend.compile(f, backend=backend)(x), f(x))
    traced = [str(n.target) for gm in backend.graphs for n in gm.graph.nodes if n.op.startswith("call")]
    assert "sin" in traced and "cos" not in traced, traced
