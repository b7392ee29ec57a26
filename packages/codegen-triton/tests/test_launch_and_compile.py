"""The GPU launch path (stream once per wrapper call, generated fast launches, Triton's C
launcher called directly), the config choice, and the compile workers, checked without a GPU:
stand-in compiled kernels record what a launch would pass."""

from __future__ import annotations

import pickle
import types

import kiln_codegen_triton.compile_workers as W
import kiln_codegen_triton.launcher as L
import pytest
import torch
from kiln_codegen_triton import TritonCodegen, compile_fx
from kiln_codegen_triton.codegen import MANY_ROWS, MIN_PROGRAMS, POINTWISE_TILE, candidate_configs
from kiln_codegen_triton.kernel import Tiling


# ------------------------------------------------------------------------------ configs
def _reduction(rblock=None, split=False):
    t = Tiling("reduction", {"xnumel": 1})
    t.persistent_rblock, t.split, t.rnumel_hint = rblock, split, rblock or 100_000
    return t


def test_pointwise_kernels_get_one_config_from_the_size_hints():
    assert len(candidate_configs(Tiling("pointwise1d"), 1 << 20, 1, False)) == 1
    (c,) = candidate_configs(Tiling("pointwise2d"), 49, 65536, False)
    assert (c["XBLOCK"], c["YBLOCK"], c["num_warps"]) == (64, 16, 4)  # 8 elements per thread
    (c,) = candidate_configs(Tiling("pointwise2d"), 8, 10_000, False)  # short rows: taller tiles
    assert c["XBLOCK"] == 8 and 8 < c["YBLOCK"] <= POINTWISE_TILE // 8
    (c,) = candidate_configs(Tiling("pointwise2d"), 3, 5, False)
    assert (c["XBLOCK"], c["YBLOCK"], c["num_warps"]) == (4, 8, 1)


@pytest.mark.parametrize("rblock,rows", [(1024, 6304), (256, 6304), (64, 65536), (32, MANY_ROWS)])
def test_persistent_reduction_over_many_rows_gets_one_config(rblock, rows):
    (c,) = candidate_configs(_reduction(rblock), rows, 1, False)
    assert c["RBLOCK"] == rblock and c["XBLOCK"] * rblock <= 2048
    programs = -(-rows // c["XBLOCK"])
    assert programs >= MIN_PROGRAMS or c["XBLOCK"] == 1
    assert c["XBLOCK"] * 2 * rblock > 2048 or -(-rows // (2 * c["XBLOCK"])) < MIN_PROGRAMS  # the largest


def test_reductions_where_more_than_one_config_is_plausible_are_benchmarked():
    assert len(candidate_configs(_reduction(1024), 100, 1, False)) == 2  # few rows
    assert len(candidate_configs(_reduction(4096), 8192, 1, False)) == 2  # one row per program: warps
    assert len(candidate_configs(_reduction(None), 64, 1, False)) == 2  # looped
    assert len(candidate_configs(_reduction(None, split=True), 1, 1, False)) >= 2
    for t in (_reduction(1024), _reduction(None), Tiling("pointwise2d")):  # the interpreter: one
        assert len(candidate_configs(t, 100, 100, True)) == 1


# ------------------------------------------------------------------------------ wrapper
def test_wrapper_reads_the_stream_once_per_call_and_passes_it_to_every_launch():
    def f(x):
        y = x.sin() + 1
        return y.softmax(-1), (y * 2).sum(0)

    x = torch.randn(8, 33)
    compiled = compile_fx(torch.fx.symbolic_trace(f), [x])
    src = compiled.source
    assert src.count("stream = ") == 1 and "stream = None" in src  # CPU tensors: the interpreter
    launches = [ln for ln in src.splitlines() if ".run(" in ln]
    assert len(launches) >= 2 and all(".run(stream, " in ln for ln in launches)
    for got, want in zip(compiled(x), f(x), strict=True):
        torch.testing.assert_close(got, want)


def test_cuda_prelude_guards_the_device_and_reads_the_stream():
    prelude = TritonCodegen(interpret=True).wrapper_prelude(torch.device("cuda", 1))
    assert "torch.cuda.set_device(1)" in prelude and prelude.count("get_raw_stream(1)") == 1
    assert TritonCodegen(interpret=True).wrapper_prelude(torch.device("cpu")) == "stream = None"


# ------------------------------------------------------------------------------ direct launch
def _c_launcher(layout: str):
    """A stand-in for Triton's ``CudaLauncher``: a Python ``__call__`` that hands a C
    ``launch`` the grid, stream, kernel constants and arguments (``layout``: as one tuple like
    Triton 3.9, splatted, or computing with the grid, which keeps the call through ``run``)."""
    calls = []

    class CudaLauncher:
        global_scratch_size = profile_scratch_size = 0

        def __init__(self):
            self.launch = lambda *a: calls.append(a)
            self.arg_annotations = ("annotations",)

        def __call__(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit, *args):
            if layout == "tuple":
                self.launch(gx, gy, gz, stream, function, False, False, metadata, launch_metadata, enter, exit,
                            None, None, self.arg_annotations, b"sig", args)
            elif layout == "splat":
                self.launch(gx, gy, gz, stream, function, metadata, *args)
            else:
                self.launch(gx * gy * gz, stream, function, metadata, args)

    class Compiled:
        function, packed_metadata = 77, "meta"

        def __init__(self):
            self.run = CudaLauncher()

    return Compiled(), calls


@pytest.mark.parametrize("layout", ["tuple", "splat"])
def test_direct_launch_calls_the_c_launcher_with_the_recorded_layout(layout):
    kernel, calls = _c_launcher(layout)
    direct = L.DirectLaunch.of(kernel, 4)  # 3 arguments + 1 constexpr
    assert direct.tokens[0] == "_launch("
    out, x = torch.zeros(64), torch.zeros(64)
    direct.general((128,))(3, 1, 1, 555, (out, x, 64))
    slow = []
    fast = direct.fast(2, (3, 1, 1), (64, 128), lambda *a: slow.append(a))  # (64: stands in for n)
    fast(556, out, x)
    fast(557, out[1:], x)  # an unaligned pointer: the slow path
    if layout == "tuple":
        assert calls[0] == (3, 1, 1, 555, 77, False, False, "meta", None, None, None, None, None,
                            ("annotations",), b"sig", (out, x, 64, 128))
        assert calls[1][:4] == (3, 1, 1, 556) and calls[1][-1] == (out, x, 64, 128)
    else:
        assert calls[0] == (3, 1, 1, 555, 77, "meta", out, x, 64, 128)
        assert calls[1] == (3, 1, 1, 556, 77, "meta", out, x, 64, 128)
    assert len(calls) == 2 and len(slow) == 1 and slow[0][0] == 557
    assert slow[0][1].data_ptr() == out.data_ptr() + 4 and slow[0][2] is x


def test_direct_launch_keeps_run_where_the_layout_cannot_be_recorded(monkeypatch):
    kernel, calls = _c_launcher("computes")
    direct = L.DirectLaunch.of(kernel, 2)
    assert direct.tokens[0] == "_run("
    out = torch.zeros(4)
    direct.general(())(2, 3, 1, 9, (out, 4))
    assert calls == [(6, 9, 77, "meta", (out, 4))]  # through the launcher's own __call__
    assert L.DirectLaunch.of(_c_launcher("tuple")[0], 2).tokens[0] == "_launch("
    monkeypatch.setenv("KILN_TRITON_DIRECT_LAUNCH", "0")
    assert L.DirectLaunch.of(_c_launcher("tuple")[0], 2).tokens[0] == "_run("


def test_static_launcher_installs_a_fast_path_after_the_first_compile(monkeypatch):
    monkeypatch.setattr(L, "_interpreting", lambda: False)
    monkeypatch.setattr(L, "_lean_launch_enabled", lambda: True)
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: 1234])
    compiled_kernels = []

    class JitFunction:
        arg_names = ["out", "x", "XBLOCK"]
        final = None

        def run(self, *args, grid, warmup, **kw):
            kernel, calls = _c_launcher("tuple")
            compiled_kernels.append(calls)
            return type("K", (), {"function": 77, "packed_metadata": "meta", "run": kernel.run,
                                  "_init_handles": lambda self: None})()

    spec = L.KernelSpec(source="# stand-in fast", tiling="pointwise1d", configs=[{"XBLOCK": 128, "num_warps": 4}],
                        numels={"xnumel": 300}, arg_names=["out", "x"], written=[0])
    launcher = L.TritonLauncher("k", JitFunction(), "k.py", spec)
    out, x = torch.zeros(300), torch.zeros(300)
    launcher.run(42, out, x)  # compiles (Triton's run launches it) and installs the fast path
    assert launcher.run != launcher._run_general and "data_ptr" in launcher.run.source
    launcher.run(43, out, x)
    (calls,) = compiled_kernels
    assert calls == [(3, 1, 1, 43, 77, False, False, "meta", None, None, None, None, None,
                      ("annotations",), b"sig", (out, x, 128))]
    launcher.run(44, out[1:], x[1:])  # unaligned pointers: another specialization, compiled once
    assert len(compiled_kernels) == 2
    launcher(out, x)  # outside a wrapper: the stream from the driver
    assert calls[-1][3] == 1234


# ------------------------------------------------------------------------------ compile workers
KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def kiln_kernel(x, y, n, XBLOCK: tl.constexpr):
    o = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(y + o, tl.sin(tl.load(x + o, o < n)), o < n)
'''


def test_compile_jobs_are_picklable_and_run_in_process(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text(KERNEL)
    job = W.job_for(str(path), [torch.float32, torch.float16, "int"], [300], {"XBLOCK": 128, "num_warps": 4},
                    device="cpu")
    assert pickle.loads(pickle.dumps(job)) == job
    assert job.arg_types == ("float32", "float16", "int") and dict(job.config)["XBLOCK"] == 128
    assert W.compile_job(job) is None  # (the interpreter: nothing to compile, the path runs)
    bad = W.job_for(str(tmp_path / "missing.py"), ["int"], [1], {})
    assert "FileNotFoundError" in W.compile_job(bad)


#: the start of a script ``_run_fresh`` runs: the worker module loaded as a worker loads it
#: (from its file: no kiln), the kernel file's path in ``path``; no nvidia backend: a skip
WORKER_SCRIPT_PRELUDE = """
import importlib.util, json, pickle, sys
from triton.backends import backends
if "nvidia" not in backends:
    print(json.dumps({"skip": "this triton has no nvidia backend"}))
    sys.exit(0)
from triton.backends.compiler import GPUTarget
spec = importlib.util.spec_from_file_location("worker", sys.argv[2])
W = sys.modules["worker"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(W)
path = sys.argv[1]
"""


def _run_fresh(tmp_path, script: str) -> dict:
    """``WORKER_SCRIPT_PRELUDE + script`` in a fresh Python on ``KERNEL`` (no TRITON_INTERPRET,
    Triton's cache in ``tmp_path/triton-cache``): the JSON of its last line (skips when the
    installed Triton has no nvidia backend)."""
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "kernel.py"
    path.write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    out = subprocess.run([sys.executable, "-c", WORKER_SCRIPT_PRELUDE + script, str(path), W.__file__],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


#: a worker's captured-arguments job in a fresh process (no TRITON_INTERPRET: see
#: test_cooperative_compile.py), its arguments as Triton 3.x's JIT builds them
CAPTURED_JOB = """
W._warm_up(["cuda", "90", "32"])  # what a worker compiles first, while the parent traces
from triton.compiler.compiler import make_backend
target = GPUTarget("cuda", 90, 32)
captured = ({"x": "*fp32", "y": "*fp32", "n": "i32", "XBLOCK": "constexpr"}, {(3,): 128},
            {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}, target,
            {"num_warps": 4}, make_backend(target).hash())
job = W.job_for(path, ["float32", "float32", "int"], [300], {"XBLOCK": 128}, captured=(captured,))
job = W.CompileJob(*pickle.loads(pickle.dumps(W._job_fields(job))))  # as it crosses the pipe
import inspect
from triton.backends.nvidia.driver import CudaLauncher
per_signature = "driver.active" not in inspect.getsource(CudaLauncher.__init__)
print(json.dumps({"error": W.compile_job(job), "torch_imported": "torch" in sys.modules,
                  "launcher_per_signature": per_signature}))
"""


def test_a_captured_job_compiles_without_torch(tmp_path):
    """A worker's warm-up compile and a job with the JIT's captured compile arguments
    compile with ``triton.compile`` alone (here for sm_90, no GPU), and the worker never
    imports torch (its start then takes well under a second)."""
    result = _run_fresh(tmp_path, CAPTURED_JOB)
    assert result["error"] is None and result["torch_imported"] is False
    built = [p.name for p in (tmp_path / "triton-cache").rglob("*")]
    assert {"kiln_warm_up.cubin", "kiln_kernel.cubin"} <= set(built), built
    if result["launcher_per_signature"]:  # (Triton 3.6: a C launcher per signature, built by gcc)
        assert any(name.startswith("__triton_launcher") for name in built), built


KEYED_AS_PARENT = """
from triton.compiler import ASTSource, compile
from triton.compiler.compiler import make_backend
target = GPUTarget("cuda", 90, 32)
fn = W._module(path).kiln_kernel
def source():
    return ASTSource(fn, {"x": "*fp32", "y": "*fp32", "n": "i32", "XBLOCK": "constexpr"}, {(3,): 128})
own = compile(source(), target=target, options={"num_warps": 4}).hash
as_own = W._compile_keyed_as_parent(source(), target, {"num_warps": 4}, make_backend(target).hash()).hash
as_other = W._compile_keyed_as_parent(source(), target, {"num_warps": 4}, "another ptxas-90").hash
print(json.dumps({"own": own, "as_own": as_own, "as_other": as_other,
                  "restored": make_backend(target).hash() != "another ptxas-90"}))
"""


def test_a_worker_keys_its_binary_by_the_parents_backend_hash(tmp_path):
    """The cache key of a worker's compile takes the backend's hash the parent sent (Triton
    caches ptxas's version per process, so a worker started after torch.compile changed
    ``TRITON_PTXAS_PATH`` would key by another one and the parent would compile again):
    with the process's own hash it is the key ``triton.compile`` gives, with another hash
    another key, and the backend is left as it was."""
    result = _run_fresh(tmp_path, KEYED_AS_PARENT)
    assert result["as_own"] == result["own"]
    assert result["as_other"] != result["own"]
    assert result["restored"]


COMPILED_STANDIN = """
class Compiled:
    loads = 0
    def _init_handles(self):  # where Triton builds the signature's C launcher
        Compiled.loads += 1
class JitFunction:
    def warmup(self, *args, grid, **meta):
        return Compiled()
kiln_kernel = JitFunction()
"""


def test_a_compile_job_loads_what_it_compiled(tmp_path):
    """The worker loads each kernel it compiles (``load_handles``), so Triton's C launcher for
    that signature is built there, in parallel, not in the first call."""
    path = tmp_path / "kernel.py"
    path.write_text(COMPILED_STANDIN)
    assert W.compile_job(W.job_for(str(path), ["int"], [8], {"XBLOCK": 64}, device="cpu")) is None
    assert W._MODULES[str(path)].Compiled.loads == 1


def test_pool_size_follows_the_env_the_cpus_and_the_gpu_memory(monkeypatch):
    monkeypatch.setenv("KILN_TRITON_COMPILE_WORKERS", "3")
    assert W.pool_size() == 3
    monkeypatch.delenv("KILN_TRITON_COMPILE_WORKERS")
    monkeypatch.setattr(W.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert W.pool_size() == 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = type("Props", (), {"total_memory": 24 * 2**30})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert W.pool_size() == 3  # one worker per 8 GiB of a 24 GiB GPU


def test_worker_process_compiles_jobs_and_the_pool_waits_for_it(tmp_path, monkeypatch):
    """One real worker subprocess (jobs and replies over its pipes); ``submit`` offers jobs
    only once the workers are up; a dead worker breaks the pool (pairs compile in-process)."""
    path = tmp_path / "kernel.py"
    path.write_text(KERNEL)
    jobs = [W.job_for(str(path), [torch.float32, torch.float32, "int"], [8], {"XBLOCK": b}, device="cpu")
            for b in (64, 128)] + [W.job_for(str(tmp_path / "missing.py"), ["int"], [1], {})]
    W.shutdown()
    assert W.submit(jobs[0]) is None  # no pool
    pool = W._Pool(1)
    monkeypatch.setattr(W, "_POOL", [pool])
    pool.ready[0].result(timeout=120)  # the worker imported torch and triton
    assert W.ready()
    futures = [W.submit(j) for j in jobs]
    results = [f.result(timeout=120) for f in futures]
    assert results[:2] == [None, None] and "FileNotFoundError" in results[2]
    W.wait(futures[0])
    pool.procs[0].kill()
    pool.procs[0].wait()
    dead = pool.submit(jobs[0])
    with pytest.raises(Exception):  # noqa: B017  (EOF or the broken pool)
        dead.result(timeout=60)
    assert pool.broken and not W.ready() and W.submit(jobs[0]) is None
    pool.shutdown()


GPU_CHECK = '''
import torch, kiln_runtime
import kiln_codegen_triton.launcher as L
from kiln_codegen_triton import compile_fx

def f(x, y):
    a = torch.cos(x) + torch.sin(y)
    return a.softmax(-1), (a * 2).sum(0), x[:, 1:] * 3

x, y = torch.randn(64, 257, device="cuda"), torch.randn(64, 257, device="cuda")
compiled = compile_fx(torch.fx.symbolic_trace(f), [x, y])
for _ in range(3):
    for got, want in zip(compiled(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want)
xs = torch.randn(64 * 257 + 1, device="cuda")[1:].view(64, 257)  # unaligned: the general path
for got, want in zip(compiled(xs, y), f(xs, y), strict=True):
    torch.testing.assert_close(got, want)
launchers = [v for v in compiled.call.__globals__.values() if isinstance(v, L.TritonLauncher)]
assert any(ln.run != ln._run_general for ln in launchers), "no fast path installed"
print("c_launch", kiln_runtime.counters["triton_c_launch_kernels"], "lean", kiln_runtime.counters["triton_lean_launch_kernels"])
'''


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the real Triton launcher)")
def test_gpu_fast_path_and_c_launch_match_eager(tmp_path):
    """On a GPU, outside the interpreter this directory's conftest sets: the generated fast
    path and the recorded C launch give eager's results, aligned and unaligned."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KILN_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", GPU_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "c_launch" in proc.stdout


def test_a_models_repeated_layers_print_one_kernel_source():
    """Kernel parameters are named by position (out_ptr0, in_ptr0), not after the graph's
    buffers, so the same layer twice gives the same source twice: one compile (and one
    autotuning) serves every layer of a model (vit_base: 38 kernels, 7 sources)."""
    import kiln_loopir
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    def two_layers(x, w1, b1, w2, b2):
        x = torch.nn.functional.gelu(x @ w1 + b1)
        return torch.nn.functional.gelu(x @ w2 + b2)

    args = [torch.randn(8, 32), torch.randn(32, 32), torch.randn(32), torch.randn(32, 32), torch.randn(32)]
    gm = make_fx(two_layers, decomposition_table=core_aten_decompositions(), tracing_mode="fake")(*args)
    module = kiln_loopir.generate_wrapper(kiln_loopir.schedule(kiln_loopir.lower(gm, args)), TritonCodegen())
    sources = [k.source for k in module.kernels]
    assert len(sources) == 2, [k.name for k in module.kernels]
    assert sources[0] == sources[1]
    assert "in_ptr0" in sources[0] and "out_ptr0" in sources[0]
    got = compile_fx(gm, args)(*args)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, two_layers(*args))


def test_the_parents_triton_warm_up_starts_once(monkeypatch):
    """``warm_up_parent`` fills Triton's per-process state in one background thread, however
    often graphs ask for it; its ``_triton_key`` is the function Triton's cache keys call."""
    import threading

    calls = []
    monkeypatch.setattr(W, "_PARENT_WARM", [])
    monkeypatch.setattr(W, "_warm_parent_state", lambda: calls.append(threading.current_thread().name))
    W.warm_up_parent()
    W.warm_up_parent()
    (thread,) = W._PARENT_WARM
    thread.join(timeout=10)
    assert calls == ["kiln-triton-warm-up"]
    from triton.compiler import compiler

    assert W._triton_key() is getattr(compiler, "triton_key", None) or W._triton_key().__module__ == "triton.runtime.cache"


class OutOfResources(Exception):
    """Triton's error when a kernel's tiles need more shared memory than the GPU has (the
    launcher tells it by name: Triton's module for it moves between versions)."""


class _TemplateJit:
    """A stand-in for a ``@triton.jit`` template that fits only at ``fits`` stages or fewer."""

    arg_names = ["X", "BLOCK"]

    def __init__(self, fits: int, error=OutOfResources):
        self.fits, self.error, self.tried = fits, error, []

    def run(self, *args, grid, warmup, **kw):
        self.tried.append(kw["num_stages"])
        if kw["num_stages"] > self.fits:
            raise self.error("out of resource: shared memory")
        return types.SimpleNamespace(_init_handles=lambda: None)


def test_a_template_that_needs_more_shared_memory_runs_with_fewer_stages():
    fn = _TemplateJit(fits=1)
    L.TemplateLauncher(fn, "kiln_kernel", "k.py")._first_launch(
        (object(),), (1, 1, 1), {"BLOCK": 64}, {"num_warps": 4, "num_stages": 3})
    assert fn.tried == [3, 2, 1]
    fn = _TemplateJit(fits=0)  # fits nowhere: the error is the user's to see
    with pytest.raises(OutOfResources):
        L.TemplateLauncher(fn, "kiln_kernel", "k.py")._first_launch(
            (object(),), (1, 1, 1), {"BLOCK": 64}, {"num_warps": 4, "num_stages": 3})
    fn = _TemplateJit(fits=1, error=ValueError)  # any other error is not retried
    with pytest.raises(ValueError):
        L.TemplateLauncher(fn, "kiln_kernel", "k.py")._first_launch(
            (object(),), (1, 1, 1), {"BLOCK": 64}, {"num_warps": 4, "num_stages": 3})
    assert fn.tried == [3]
