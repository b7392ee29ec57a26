"""The graph-level compiled-artifact cache (kiln.cache) and KILN_LOGS=perf compile phases.

Cross-process behaviour (a second process, a shipped blob) is in
tests-integration/test_cache_process.py."""

from __future__ import annotations

import logging

import kiln
import kiln.cache
import kiln_runtime
import pytest
import torch
from _nets import ConvNormFc
from kiln.backend import kiln_backend
from kiln.options import Options
from kiln.wrappers import structure_restorer
from kiln_runtime.guards import WeightsGuard
from torch import nn

pytestmark = pytest.mark.usefixtures("graph_cache_on")


def Net():
    return ConvNormFc(64, mean_too=True)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = Net().eval()
    with torch.no_grad():
        m.norm.running_mean.uniform_(-0.5, 0.5)
        m.norm.running_var.uniform_(0.5, 1.5)
    return m


def _compile(m: nn.Module, x: torch.Tensor, options=None):
    gm = torch.fx.symbolic_trace(m)  # a fresh GraphModule each time, as a new process has
    with torch.no_grad():
        compiled = kiln_backend(gm, [x], options)
    kiln.cache.flush()  # entries are written in the background
    return compiled


def _delta(before, after, *names):
    return {n: getattr(after, n) - getattr(before, n) for n in names}


X = torch.randn(2, 3, 6, 6)


def test_second_compile_hits_and_skips_the_pipeline(monkeypatch):
    m = _net(0)
    first = _compile(m, X)
    # a hit must not run any pipeline step: make them all fail
    import kiln_aotgrad
    import kiln_loopir

    def broken(*args, **kwargs):
        raise AssertionError("the pipeline ran on a graph cache hit")

    monkeypatch.setattr(kiln_aotgrad, "trace_inference", broken)
    monkeypatch.setattr(kiln_loopir, "lower", broken)
    before = kiln.stats()
    second = _compile(m, X)
    after = kiln.stats()
    assert _delta(before, after, "graph_cache_hits", "graph_cache_misses", "cpp_compiles") == {
        "graph_cache_hits": 1, "graph_cache_misses": 0, "cpp_compiles": 0}
    assert after.kernel_cache_hits > before.kernel_cache_hits
    with torch.no_grad():
        expected = m(X)
        torch.testing.assert_close(second(X), expected)
        torch.testing.assert_close(first(X), expected)


class ConvNet(nn.Module):
    """No norm to fold: every constant is a parameter (or its channels-last copy)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 64)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_a_hit_uses_the_live_modules_weights():
    torch.manual_seed(0)
    a = ConvNet().eval()
    b = ConvNet().eval()
    _compile(a, X)
    before = kiln.stats()
    compiled_b = _compile(b, X)
    assert kiln.stats().graph_cache_hits == before.graph_cache_hits + 1
    with torch.no_grad():
        torch.testing.assert_close(compiled_b(X), b(X))
        assert not torch.allclose(compiled_b(X), a(X))


def test_weights_folded_into_constants_are_folded_again_from_the_live_weights():
    # BatchNorm folded into the conv: the entry keeps the fold's recipe, not the folded
    # tensors, so a module with other weights hits it and gets its own folded constants
    a, b = _net(0), _net(1)
    _compile(a, X)
    before = kiln.stats()
    compiled_b = _compile(b, X)
    assert kiln.stats().graph_cache_hits == before.graph_cache_hits + 1
    assert kiln.stats().graph_cache_misses == before.graph_cache_misses
    with torch.no_grad():
        torch.testing.assert_close(compiled_b(X), b(X))
        assert not torch.allclose(compiled_b(X)[0], a(X)[0])
        b.norm.running_var.mul_(4.0)  # in place: the folded constants are stale now
        torch.testing.assert_close(compiled_b(X), b(X))
        b.norm.weight.add_(0.5)  # and again, after the recompile
        torch.testing.assert_close(compiled_b(X), b(X))


def test_a_hit_guards_only_the_weights_its_constants_come_from():
    a, b = _net(0), _net(1)
    _compile(a, X)
    guard = _compile(b, X)  # a hit with folded constants: behind a weights guard
    assert isinstance(guard, WeightsGuard), guard
    guarded = {id(t) for t in guard.tensors}
    assert {id(b.conv.weight), id(b.norm.running_var), id(b.norm.weight)} <= guarded
    packed = torch.backends.mkl.is_available()  # fc.weight packed for MKL's GEMM: a derived constant
    assert (id(b.fc.weight) in guarded) == packed
    assert id(b.fc.bias) not in guarded  # the graph reads it live
    with torch.no_grad():
        b.fc.bias.add_(0.5)  # no constant comes from it: no recompile, still right
        before = guard.fn
        torch.testing.assert_close(guard(X), b(X))
        assert guard.fn is before
        b.norm.running_mean.add_(0.25)  # the folded bias is stale: compile again
        torch.testing.assert_close(guard(X), b(X))
        assert guard.fn is not before


@pytest.mark.parametrize("value, restorer", [
    ((1, 2), tuple), ([1, 2], list), (1, "itemgetter"), ((1, (2, 3)), "pytree"),
    ({"a": 1}, "pytree"), ((1, None), "pytree")])
def test_structure_restorer_picks_a_c_call_for_plain_outputs(value, restorer):
    import operator

    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(value)
    template = [(leaf is not None, leaf if leaf is None else None) for leaf in leaves]
    outputs = [leaf for leaf in leaves if leaf is not None]
    restore = structure_restorer((spec, template))
    assert restore(outputs) == value
    kind = {tuple: tuple, list: list}.get(restore) or (
        "itemgetter" if isinstance(restore, operator.itemgetter) else "pytree")
    assert kind == restorer


def test_an_entry_with_folded_constants_holds_recipes_not_weights(graph_cache_on):
    _compile(_net(0), X)
    (path,) = graph_cache_on.glob(f"{kiln.cache.KIND}/*/*/{kiln.cache.ARTIFACT}")
    artifact = kiln.cache._read(path.parent)
    kinds = [src[0] for src in artifact.constants.values()]
    assert artifact.eager_reason is None and "folded" in kinds, kinds
    assert "stored" not in kinds and not artifact.guards.all_weights


def _program_scale(x):
    """A tensor the program builds from its own data (traced as a constant, like the empty
    tensors transformers' GPT-2 makes per layer)."""
    return torch.tensor([2.0, 3.0], dtype=x.dtype)


torch.fx.wrap("_program_scale")


class ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x) * _program_scale(x)


def test_a_constant_the_trace_made_is_stored_without_keying_the_entry_by_weights(graph_cache_on):
    # the trace saw fake weights, so a constant it made cannot hold weight values: a module
    # with other weights hits the entry (no hash of every weight on store, no guard on them)
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    a, b = ScaledLinear().eval(), ScaledLinear().eval()
    _compile(a, x)
    (path,) = graph_cache_on.glob(f"{kiln.cache.KIND}/*/*/{kiln.cache.ARTIFACT}")
    artifact = kiln.cache._read(path.parent)
    assert artifact.eager_reason is None and not artifact.guards.all_weights
    assert [src[0] for src in artifact.constants.values()].count("stored") == 1
    before = kiln.stats()
    compiled_b = _compile(b, x)
    assert _delta(before, kiln.stats(), "graph_cache_hits", "graph_cache_misses") == {
        "graph_cache_hits": 1, "graph_cache_misses": 0}
    with torch.no_grad():
        torch.testing.assert_close(compiled_b(x), b(x))
        assert not torch.allclose(compiled_b(x), a(x))


def test_key_normalizes_names_and_sees_inputs_and_options():
    m = _net(0)

    def key(gm, x, options=None, grad=False):
        with torch.set_grad_enabled(grad):
            return kiln.cache.graph_key(gm, [x], Options.from_user(options))[0]

    gm = torch.fx.symbolic_trace(m)
    base = key(gm, X)
    renamed = torch.fx.symbolic_trace(m)
    for n in renamed.graph.nodes:  # names of nodes do not matter
        if n.op == "placeholder":
            n.name = n.target = "input_renamed"
    renamed.recompile()
    assert key(renamed, X) == base
    assert key(gm, X.double()) != base
    assert key(gm, torch.randn(3, 3, 6, 6)) != base
    assert key(gm, X, {"num_threads": 1}) != base
    assert key(gm, X, grad=True) != base
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's casts are in the trace
        assert key(gm, X) != base
    m.conv.stride = (2, 2)  # a module attribute changes what the graph computes
    assert key(torch.fx.symbolic_trace(m), X) != base


def test_corrupt_entry_is_rebuilt_with_a_log_line(graph_cache_on, caplog):
    m = ConvNet().eval()
    _compile(m, X)
    (artifact,) = graph_cache_on.glob(f"{kiln.cache.KIND}/*/*/{kiln.cache.ARTIFACT}")
    artifact.write_bytes(artifact.read_bytes()[:100])  # a truncated file
    before = kiln.stats()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        rebuilt = _compile(m, X)
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    after = kiln.stats()
    assert _delta(before, after, "graph_cache_misses", "cache_corrupt") == {
        "graph_cache_misses": 1, "cache_corrupt": 1}
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(X), m(X))
    _compile(m, X)  # the rebuilt entry is valid
    assert kiln.stats().graph_cache_hits == after.graph_cache_hits + 1


def test_stale_entry_is_rebuilt_with_a_log_line(caplog):
    m = ConvNet().eval()
    with torch.no_grad():
        key, _ = kiln.cache.graph_key(torch.fx.symbolic_trace(m), [X], Options())
    # a valid manifest around an artifact this version cannot use
    kiln_runtime.disk_cache.put(kiln.cache.KIND, key, {kiln.cache.ARTIFACT: b"not a pickle"})
    before = kiln.stats()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        compiled = _compile(m, X)
    assert any("stale" in r.getMessage() for r in caplog.records)
    assert kiln.stats().graph_cache_stale == before.graph_cache_stale + 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), m(X))
    _compile(m, X)
    assert kiln.stats().graph_cache_hits == before.graph_cache_hits + 1


def test_saved_artifacts_make_an_empty_cache_warm(tmp_path, monkeypatch):
    m = _net(0)
    _compile(m, X)
    blob = kiln.save_cache_artifacts()
    assert isinstance(blob, bytes) and blob
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "fresh-machine"))
    assert kiln.load_cache_artifacts(blob) >= 2  # the graph and its kernels
    before = kiln.stats()
    compiled = _compile(m, X)
    after = kiln.stats()
    assert _delta(before, after, "graph_cache_hits", "cpp_compiles", "kernel_cache_misses") == {
        "graph_cache_hits": 1, "cpp_compiles": 0, "kernel_cache_misses": 0}
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), m(X))


def test_load_cache_artifacts_rejects_other_bytes():
    with pytest.raises(ValueError, match="not a kiln cache blob"):
        kiln.load_cache_artifacts(b"definitely not a tar file" * 40)


def test_module_with_a_hook_is_compiled_but_not_cached():
    m = _net(0)
    m.fc.register_forward_hook(lambda mod, args, out: out * 2)
    before = kiln.stats()
    compiled = _compile(m, X)
    compiled_again = _compile(m, X)
    after = kiln.stats()
    assert after.graph_cache_hits == before.graph_cache_hits
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), m(X))
        torch.testing.assert_close(compiled_again(X), m(X))


def test_debug_folder_bypasses_the_cache(tmp_path):
    m = _net(0)
    _compile(m, X)
    before = kiln.stats()
    _compile(m, X, {"debug": True, "debug_dir": str(tmp_path / "dbg")})
    assert kiln.stats().graph_cache_hits == before.graph_cache_hits
    assert list((tmp_path / "dbg").rglob("output_code.py"))


def test_perf_log_prints_where_compile_time_goes(monkeypatch, capsys):
    monkeypatch.setenv("KILN_LOGS", "perf")
    m = _net(0)
    compiled = _compile(m, X)
    err = capsys.readouterr().err
    assert "[kiln.perf] compile of" in err
    for phase in ("fold constants", "trace", "lower", "schedule", "codegen", "compile kernels",
                  "cache store"):
        assert phase in err, phase
    report = kiln_runtime.compile_timer.last_report()
    assert report.total >= sum(report.phases.values()) - 1e-6
    with torch.no_grad():
        torch.testing.assert_close(compiled(X), m(X))
    _compile(m, X)
    assert "graph cache hit" in capsys.readouterr().err


def test_a_graph_compiled_outside_autocast_is_not_reused_inside(graph_cache_on):
    """The same function called without, then inside ``torch.autocast`` (the frontend's
    global-state guard recompiles it): the second compile must trace autocast's casts, not
    hit the first one's entry (it returned float32 values where eager computes bfloat16)."""
    w = torch.randn(8, 8)

    def f(a):
        return (a @ w).softmax(-1)

    compiled = kiln.compile(f)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), f(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = compiled(x), f(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)


def test_a_hit_packs_gemm_weights_with_the_graphs_threads(monkeypatch):
    """MKL packs a GEMM weight for the threads that will use it: a hit must pack with the
    graph's intra-op thread count, not under the one thread its refolds and layout copies
    take (packed on one thread, a hit's BERT-sized linears ran 1.5-2x slower at 2 threads)."""
    import dataclasses

    from kiln_loopir.derived_constants import DERIVATIONS
    from kiln_loopir.lowerings import extern

    if not extern.PACKED_GEMMS["mkl"].available():
        pytest.skip("no MKL packed GEMM in this torch")
    # MKL's GEMM, not the CPU's first choice (oneDNN's, whose reorder is not thread-tuned)
    monkeypatch.setitem(extern.DEVICE_LIBRARIES, "cpu", dataclasses.replace(
        extern.DEVICE_LIBRARIES["cpu"], packed_gemms=("mkl",)))
    pack = DERIVATIONS["mkl_packed_linear"]
    threads_seen = []

    def recording_pack(*args):
        threads_seen.append(torch.get_num_threads())
        return pack(*args)

    monkeypatch.setitem(DERIVATIONS, "mkl_packed_linear", recording_pack)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        m = _net(0)
        _compile(m, X)  # a miss: stores the entry
        threads_seen.clear()
        hits = kiln.stats().graph_cache_hits
        compiled = _compile(m, X)
        assert kiln.stats().graph_cache_hits == hits + 1
        with torch.no_grad():
            torch.testing.assert_close(compiled(X), m(X))
    finally:
        torch.set_num_threads(before)
    assert threads_seen and set(threads_seen) == {2}, threads_seen


def test_a_cache_folder_others_can_write_is_not_loaded_from(graph_cache_on, monkeypatch):
    """A warm cache in a folder group or others can write (a shared KILN_CACHE_DIR under
    /tmp) is refused with one warning: no graph entry, no kernel library is loaded from it,
    and the graph still compiles (cold, into this process's own folder)."""
    import os

    m = _net(0)
    expected = m(X)
    _compile(m, X)  # warm: graph entry and kernel .so in the folder
    os.chmod(graph_cache_on, 0o777)
    import kiln_aotgrad

    traced = []
    real_trace = kiln_aotgrad.trace_inference
    monkeypatch.setattr(kiln_aotgrad, "trace_inference",
                        lambda *a, **k: traced.append(1) or real_trace(*a, **k))
    before = kiln.stats()
    with pytest.warns(kiln_runtime.UnsafeCacheDirWarning, match=f"chmod 700 {graph_cache_on}"):
        compiled = _compile(m, X)
    after = kiln.stats()
    assert traced  # the pipeline ran: nothing came from the refused folder
    assert _delta(before, after, "graph_cache_hits", "kernel_cache_hits") == {
        "graph_cache_hits": 0, "kernel_cache_hits": 0}
    assert kiln_runtime.cache_dir() != graph_cache_on
    got = compiled(X)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
