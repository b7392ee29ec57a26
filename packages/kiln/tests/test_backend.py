"""The kiln and loopir_interpret backends, codegen choice, eager fallbacks, stats, entry points."""

from __future__ import annotations

import importlib.metadata
import logging

import kiln
import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from kiln.backend import (
    codegen_by_name,
    codegen_for_device,
    compile_aten,
    kiln_backend,
    loopir_interpret_backend,
    needs_autograd,
)
from kiln.options import Options


def kiln_records(caplog):
    return [r for r in caplog.records if r.name == "kiln"]


# ---------------------------------------------------------------- codegen choice


def test_unknown_codegen_name_lists_known():
    with pytest.raises(ValueError, match=r"unknown codegen 'fortran'; known codegens: cpp, triton"):
        codegen_by_name("fortran")


def test_unknown_codegen_in_backend_options():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="known codegens: cpp, triton"):
        kiln_backend(gm, [torch.randn(3)], options={"codegen": "fortran"})


def test_unknown_option_in_backend():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="known options: codegen"):
        kiln_backend(gm, [torch.randn(3)], options={"nope": 1})


def test_codegen_for_device_cpu_is_cpp(needs_cpp):
    from kiln_codegen_cpp import CppCodegen

    assert isinstance(codegen_for_device(torch.device("cpu"), Options()), CppCodegen)
    assert isinstance(codegen_for_device("cpu", Options(codegen="cpp")), CppCodegen)


def test_forcing_a_codegen_that_is_not_installed_is_a_clear_error():
    try:
        import kiln_codegen_triton  # noqa: F401

        if hasattr(kiln_codegen_triton, "TritonCodegen"):
            pytest.skip("kiln_codegen_triton is installed here")
    except ImportError:
        pass
    with pytest.raises(kiln.backend.CodegenUnavailable, match="triton"):
        codegen_for_device(torch.device("cpu"), Options(codegen="triton"))


# ---------------------------------------------------------------- eager fallbacks


def test_training_path_compiles_forward_and_backward(needs_cpp):
    # inputs requiring grad take the training path (kiln.training), no eager fallback
    def f(x, w):
        return (torch.sin(x) * w).sum()

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4)
    before = kiln.stats()
    compiled = kiln_backend(gm, [x, w])
    out = compiled(x, w)
    out.backward()
    torch.testing.assert_close(out, f(x.detach(), w))
    torch.testing.assert_close(x.grad, torch.cos(x.detach()) * w)
    s = kiln.stats()
    assert s.eager_fallbacks == before.eager_fallbacks
    assert s.forward_graphs_compiled == before.forward_graphs_compiled + 1
    assert s.backward_graphs_compiled == before.backward_graphs_compiled + 1


def test_parameters_requiring_grad_need_autograd():
    m = nn.Linear(3, 3)
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(2, 3)
    assert needs_autograd(gm, [x])
    with torch.no_grad():
        assert not needs_autograd(gm, [x])
    m.requires_grad_(False)
    assert not needs_autograd(gm, [x])


def test_loopir_interpret_backend_takes_the_training_path_too(needs_interpreter):
    gm = torch.fx.symbolic_trace(lambda x: (x * 2).exp())
    x = torch.randn(3, requires_grad=True)
    compiled = loopir_interpret_backend(gm, [x])
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * (2 * x.detach()).exp())


def test_aliased_mutated_inputs_run_eagerly(caplog):
    def f(x, y):
        x.add_(1)
        return y * 2

    gm = torch.fx.symbolic_trace(f)
    base = torch.zeros(4)
    with caplog.at_level(logging.INFO, logger="kiln"):
        compiled = kiln_backend(gm, [base, base[1:]])
    assert len(kiln_records(caplog)) == 1
    assert "share memory" in kiln_records(caplog)[0].getMessage()
    base2 = torch.zeros(4)
    out = compiled(base2, base2[1:])
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def test_graph_loopir_cannot_lower_runs_eagerly(caplog, needs_interpreter):
    # a symbolic float among the outputs: loopir raises LoweringError, the graph runs eagerly
    def f(x):
        return x * 2, x.shape[0] / 2

    gm = torch.fx.symbolic_trace(f)
    (fake,) = _symbolic_fakes((3, 4))
    before = kiln.stats()
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        compiled = kiln_backend(gm, [fake])
    (record,) = kiln_records(caplog)
    assert "eagerly" in record.getMessage() and "loopir cannot lower" in record.getMessage()
    assert "symbolic float" in record.getMessage()
    after = kiln.stats()
    assert after.eager_fallbacks == before.eager_fallbacks + 1
    assert after.fallback_reasons["loopir cannot lower"] >= 1
    assert after.graphs_compiled == before.graphs_compiled
    x = torch.randn(5, 4)
    out, half = compiled(x)
    torch.testing.assert_close(out, x * 2)
    assert half == 2.5


def test_pipeline_failure_names_the_step(monkeypatch, needs_interpreter):
    import kiln_loopir

    def broken_schedule(graph):
        raise RuntimeError("boom")

    monkeypatch.setattr(kiln_loopir, "schedule", broken_schedule)
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    for backend in (kiln_backend, loopir_interpret_backend):
        with pytest.raises(kiln.backend.KilnCompileError, match=r"schedule.*RuntimeError: boom") as e:
            backend(gm, [torch.randn(3)])
        assert e.value.step.startswith("schedule")
        assert isinstance(e.value.__cause__, RuntimeError)


def test_pipeline_failure_under_the_frontend_keeps_the_result(monkeypatch, needs_interpreter):
    # the frontend runs the frame eagerly with one warning naming kiln's failing step
    import kiln_frontend as frontend
    import kiln_loopir

    def broken_lower(aten_gm, example_inputs=None):
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(kiln_loopir, "lower", broken_lower)
    monkeypatch.setattr(frontend.config, "suppress_errors", True)
    frontend.reset()

    def g(x):
        return torch.tanh(x) * 3

    compiled = kiln.compile(g)
    x = torch.randn(6)
    before = kiln.stats().compile_failures.get("lower", 0)
    with pytest.warns(UserWarning, match=r"kiln's lower \(kiln_loopir.lower\) step failed"):
        got = compiled(x)
    torch.testing.assert_close(got, g(x))
    # counted, so a benchmark's fallback column shows the frame ran eagerly
    assert kiln.stats().compile_failures.get("lower", 0) == before + 1
    frontend.reset()


# ---------------------------------------------------------------- entry points


def test_backends_are_entry_points():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="kiln.backends")}
    assert eps["kiln"].load() is kiln_backend
    assert eps["loopir_interpret"].load() is loopir_interpret_backend


def test_frontend_finds_kiln_backends():
    import kiln_frontend.backends as backends

    assert backends.lookup_backend("kiln") is kiln_backend
    assert backends.lookup_backend("loopir_interpret") is loopir_interpret_backend
    assert {"kiln", "loopir_interpret"} <= set(backends.list_backends())


def test_stats_is_readable():
    s = kiln.stats()
    text = str(s)
    for name in (
        "graphs_compiled",
        "kernels_generated",
        "cache_hits",
        "cache_misses",
        "eager_fallbacks",
    ):
        assert name in text


# ---------------------------------------------------------------- the pipeline


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 4)).eval()


CASES = {
    "pointwise": (
        lambda x, y: torch.cos(x) + torch.sin(y),
        lambda: [torch.randn(5, 7), torch.randn(5, 7)],
    ),
    "softmax": (lambda x: (F.softmax(x, -1), x.sum(0)), lambda: [torch.randn(6, 9)]),
    "mutation": (lambda x: x.mul_(2).add(1), lambda: [torch.randn(10)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loopir_interpret_backend_matches_eager(case, needs_interpreter):
    fn, make_inputs = CASES[case]
    gm = torch.fx.symbolic_trace(fn)
    inputs = make_inputs()
    compiled = loopir_interpret_backend(gm, [t.clone() for t in inputs])
    got_in = [t.clone() for t in inputs]
    exp_in = [t.clone() for t in inputs]
    torch.testing.assert_close(compiled(*got_in), fn(*exp_in))
    torch.testing.assert_close(got_in, exp_in)


def _compiled_mlp_matches_eager(backend):
    """``_mlp()`` compiled by ``backend`` under no_grad gives eager's result: (compiled, x)."""
    m = _mlp()
    gm = torch.fx.symbolic_trace(m)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled = backend(gm, [x])
        torch.testing.assert_close(compiled(x), m(x))
    return compiled, x


def test_loopir_interpret_backend_module(needs_interpreter):
    _compiled_mlp_matches_eager(loopir_interpret_backend)


@pytest.mark.parametrize("case", sorted(CASES))
def test_kiln_backend_matches_eager(case, needs_cpp):
    fn, make_inputs = CASES[case]
    gm = torch.fx.symbolic_trace(fn)
    inputs = make_inputs()
    before = kiln.stats()
    compiled = kiln_backend(gm, [t.clone() for t in inputs])
    got_in = [t.clone() for t in inputs]
    exp_in = [t.clone() for t in inputs]
    torch.testing.assert_close(compiled(*got_in), fn(*exp_in))
    torch.testing.assert_close(got_in, exp_in)
    after = kiln.stats()
    assert after.graphs_compiled == before.graphs_compiled + 1
    assert after.kernels_generated > before.kernels_generated


def test_kiln_backend_module_and_grad_mode_guard(needs_cpp):
    compiled, x = _compiled_mlp_matches_eager(kiln_backend)
    # compiled under no_grad, later called with grad on: runs eagerly, keeps autograd
    out = compiled(x)
    assert out.requires_grad and out.grad_fn is not None


def test_compile_aten_directly(needs_cpp):
    import kiln_aotgrad

    def f(x):
        return x.exp() - 1

    x = torch.randn(4, 4)
    aten_gm = kiln_aotgrad.trace_inference(torch.fx.symbolic_trace(f), [x])
    compiled = compile_aten(aten_gm, Options(codegen="cpp"))
    torch.testing.assert_close(compiled(x), f(x))


def test_kiln_backend_under_torch_compile(needs_cpp):
    # kiln's backend has torch.compile's signature (tests may use torch.compile as a reference)

    def f(x):
        return torch.relu(x) * 2 + 1

    compiled = torch.compile(f, backend=kiln_backend, dynamic=False)
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), f(x))


# ---------------------------------------------------------------- dynamic sizes


def _symbolic_fakes(*shapes):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    class SequentialShapeEnv(ShapeEnv):  # symbols s0, s1, ... in creation order
        def _generate_unique_id(self, source_name):
            uid = len(self.unique_ids)
            self.unique_ids.add(uid)
            return uid

    mode = FakeTensorMode(shape_env=SequentialShapeEnv())
    return [
        mode.from_tensor(
            torch.randn(s),
            symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(s)),
        )
        for s in shapes
    ]


def _sin_cos(x):
    y = x.sin()
    z = y.cos()
    return y, z


@pytest.mark.parametrize("backend", ["kiln", "loopir_interpret"])
def test_dynamic_sizes_end_to_end(backend, needs_interpreter, request):
    if backend == "kiln":
        request.getfixturevalue("needs_cpp")
    be = kiln_backend if backend == "kiln" else loopir_interpret_backend
    gm = torch.fx.symbolic_trace(_sin_cos)
    before = kiln.stats().kernels_generated
    compiled = be(gm, _symbolic_fakes((3, 5)))
    if backend == "kiln":  # the seed example: one kernel, two stores
        assert kiln.stats().kernels_generated == before + 1
    for shape in [(3, 5), (6, 2), (1, 9)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), _sin_cos(x))


def test_dynamic_softmax_layernorm_matmul(needs_cpp):
    def g(x, w):
        y = x @ w
        return F.softmax(y, -1) + F.layer_norm(y, (w.shape[1],))

    compiled = kiln_backend(torch.fx.symbolic_trace(g), _symbolic_fakes((3, 5), (5, 4)))
    for m, k, n in [(3, 5, 4), (7, 10, 6)]:
        x, w = torch.randn(m, k), torch.randn(k, n)
        torch.testing.assert_close(compiled(x, w), g(x, w))


class _LaunchFailed(RuntimeError):
    """Stands for a codegen's compile error raised at a kernel's first launch."""


def test_a_kernel_that_fails_at_its_first_launch_runs_on_the_interpreter(monkeypatch, caplog, needs_interpreter):
    """Triton launchers compile at a kernel's first launch, inside the graph's first call: a
    compile error there switches the graph to loopir's interpreter with one warning (it is
    not raised to the user); a first call that succeeds costs nothing afterwards."""
    import kiln.assemble as assemble
    import kiln.backend as backend
    import kiln.stages
    import kiln_aotgrad
    import kiln_runtime

    monkeypatch.setattr(kiln.stages, "compile_errors", lambda: (_LaunchFailed,))

    def f(x):
        return torch.softmax(x, -1) * 2

    x = torch.randn(3, 5)
    schedule = backend.lower_and_schedule(kiln_aotgrad.trace_inference(torch.fx.symbolic_trace(f), [x]))

    def failing(args):
        args.clear()  # as a generated wrapper does, before a launch fails
        raise _LaunchFailed("kernel k did not compile")

    graph = kiln_runtime.CompiledGraph(failing, "", "<test>", None)
    wrapped = assemble._interpret_if_first_launch_fails(
        graph, lambda e: assemble.interpret_instead(schedule, e))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        (got,) = wrapped(x)
        (again,) = wrapped(x)
    torch.testing.assert_close(got, f(x))
    torch.testing.assert_close(again, f(x))
    assert sum("loopir interpreter instead" in r.getMessage() for r in caplog.records) == 1

    calls = []

    def working(args):
        calls.append(len(args))
        return [args[0] * 1]

    graph = kiln_runtime.CompiledGraph(working, "", "<test>", None)
    wrapped = assemble._interpret_if_first_launch_fails(
        graph, lambda e: assemble.interpret_instead(schedule, e))
    wrapped(x)
    assert graph.call is working  # the check is gone after a first call that succeeds
    wrapped(x)
    assert calls == [1, 1]
