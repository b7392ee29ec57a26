"""The whole CPU pipeline on hand-built FX graphs: aotgrad -> loopir -> C++ -> runtime.

Every result is checked against eager torch and against the loopir interpreter running the
same schedule."""

import math
import os
import warnings

import kiln_codegen_cpp
import kiln_loopir
import kiln_runtime
import pytest
import torch
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx
from kiln_codegen_cpp.compiler import vectorized_loops
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext


def symbolic(*tensors):
    """Fake example inputs whose every dim is a SymInt (a dynamic-shape compile)."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())) for t in tensors]


def run(fn, *inputs, dynamic=False, **tol):
    """Compile ``fn`` (through torch.fx.symbolic_trace), check outputs vs eager and vs the
    loopir interpreter on the same schedule; return the compiled callable."""
    gm = torch.fx.symbolic_trace(fn)
    examples = symbolic(*inputs) if dynamic else list(inputs)
    compiled = compile_fx(gm, examples)
    got = compiled(*inputs)
    expected = fn(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **tol)
    ref = kiln_loopir.interpret(compiled.module.meta["schedule"])(*inputs)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, **tol)
    return compiled


def kernels(compiled):
    return compiled.module.kernels


def test_seed_cos_plus_sin_one_kernel_vectorized():
    def f(x, y):
        return torch.cos(x) + torch.sin(y)

    c = run(f, torch.randn(16, 64), torch.randn(16, 64))
    (k,) = kernels(c)
    assert k.meta["loads"] == 2 and k.meta["stores"] == 1
    body = k.meta["body"]
    innermost = [ln.strip() for ln in body.splitlines() if ln.strip().startswith("for (")][-1]
    assert "simd" in body.splitlines()[[ln.strip() for ln in body.splitlines()].index(innermost) - 1]
    assert innermost in vectorized_loops(k.source)


def test_dynamic_two_shapes_one_compile():
    def f(x):
        y = x.sin()
        z = y.cos()
        return y, z

    c = run(f, torch.randn(5, 7), dynamic=True)
    (k,) = kernels(c)
    assert k.meta["stores"] == 2  # one kernel writes y and z
    assert "xnumel = s0*s1" in c.module.wrapper_source
    assert "out_ptr0[i0] = " in k.meta["body"] and "out_ptr1[i0] = " in k.meta["body"]
    for shape in [(3, 100), (64, 3)]:
        x = torch.randn(shape)
        y, z = c(x)
        torch.testing.assert_close(y, x.sin())
        torch.testing.assert_close(z, x.sin().cos())


def test_pointwise_chain_and_broadcasting():
    def f(x, b, s):
        return torch.relu(x * 2 + b) - torch.sigmoid(s) / (1 + x.abs())

    run(f, torch.randn(4, 8, 33), torch.randn(33), torch.randn(8, 1))


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_reductions(dim):
    def f(x):
        return x.sum(dim), x.amax(dim), x.argmin(dim), x.mean(dim)

    run(f, torch.randn(20, 30, 17), rtol=1e-5, atol=1e-5)


def test_softmax_single_kernel():
    c = run(lambda x: torch.softmax(x, -1), torch.randn(32, 129))
    (k,) = kernels(c)
    assert len(k.meta["locals"]) == 2


def test_layernorm_gelu():
    w, b = torch.randn(64), torch.randn(64)

    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (64,), w, b))

    run(f, torch.randn(8, 16, 64), w, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype):
    def f(x, y):
        return (x * y + 1).exp2(), torch.softmax(x, -1), x.sum(-1)

    x = torch.randn(8, 40).to(dtype)
    y = torch.randn(8, 40).to(dtype)
    run(f, x, y, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_dtypes(dtype):
    def f(a, b):
        return a // b, a % b, (a * 3 - b).abs(), a.sum(-1), (a > b) & (b > 0)

    a = torch.randint(-50, 50, (6, 37), dtype=dtype)
    b = torch.randint(1, 9, (6, 37), dtype=dtype) * torch.where(torch.rand(6, 37) > 0.5, 1, -1).to(dtype)
    run(f, a, b)


def test_bool_dtype():
    def f(m, x):
        return torch.where(m, x, -x), m.any(-1), m.logical_not() | (x > 0)

    run(f, torch.rand(5, 20) > 0.5, torch.randn(5, 20))


def test_non_contiguous_inputs():
    def f(x, y):
        return x * y + x.t().sum(1)

    x = torch.randn(30, 20).t()  # [20, 30], strides (1, 20)
    y = torch.randn(20, 60)[:, ::2]  # [20, 30], strides (60, 2)
    run(f, x, y)


def test_cache_hit_on_second_compile():
    def f(x):
        return torch.tanh(x) * 3.25 + 0.125

    x = torch.randn(10, 10)
    run(f, x)
    before = dict(kiln_runtime.counters)
    run(f, x)
    after = kiln_runtime.counters
    assert after["disk_cache_hits"] > before.get("disk_cache_hits", 0)
    assert after["cpp_compiles"] == before.get("cpp_compiles", 0)


def test_corrupt_cache_entry_is_rebuilt():
    def f(x):
        return torch.tanh(x) * 7.5 - 0.25

    x = torch.randn(10, 10)
    c = run(f, x)
    from kiln_codegen_cpp.compiler import cache_key

    entry = kiln_runtime.disk_cache.entry_dir("cpp", cache_key(kernels(c)[0].source))
    # a corrupted build (replaced, not truncated in place: this process has the file mapped)
    (entry / "garbage").write_bytes(b"\x7fELF garbage")
    os.replace(entry / "garbage", entry / "kernel.so")
    before = dict(kiln_runtime.counters)
    run(f, x)
    assert kiln_runtime.counters["disk_cache_corrupt"] == before.get("disk_cache_corrupt", 0) + 1
    assert kiln_runtime.counters["cpp_compiles"] == before.get("cpp_compiles", 0) + 1


def test_compile_error_falls_back_to_interpreter_with_one_warning(monkeypatch):
    from kiln_codegen_cpp import codegen

    monkeypatch.setattr(codegen, "prelude", lambda: "#error kiln test: broken prelude\n")

    def f(x):
        return x.exp() + 1

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = compile_fx(gm, [x])
    mine = [w for w in caught if issubclass(w.category, kiln_codegen_cpp.KilnFallbackWarning)]
    assert len(mine) == 1
    assert ".cpp" in str(mine[0].message) and "broken prelude" in str(mine[0].message)
    torch.testing.assert_close(fn(x)[0], f(x))


def test_output_code_runs_standalone(tmp_path):
    import subprocess
    import sys

    c = run(lambda x: torch.softmax(x, -1) * 2, torch.randn(8, 50))
    path = tmp_path / "output_code.py"
    path.write_text(c.module.meta["output_code"])
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ms per call" in proc.stdout


def test_extern_matmul_with_fused_epilogue():
    def f(x, w, b):
        return torch.relu(x @ w + b)

    run(f, torch.randn(16, 32), torch.randn(32, 8), torch.randn(8), rtol=1e-4, atol=1e-4)


def test_math_constants_and_inf():
    def f(x):
        return torch.clamp(x, min=-math.inf, max=1.5) + torch.full_like(x, float("inf")).minimum(x)

    run(f, torch.randn(3, 9))


class _Block(torch.nn.Module):
    """A transformer-ish block: layernorms, attention softmax, MLP with gelu, residuals."""

    def __init__(self, d=64):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q = torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + torch.softmax(self.q(h) @ h.transpose(-1, -2) / 8.0, -1) @ h
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_module_with_parameters_and_memory_reuse():
    torch.manual_seed(0)
    block = _Block().eval()
    with torch.no_grad():
        c = run(block, torch.randn(2, 16, 64), rtol=1e-4, atol=1e-4)
    assert len(kernels(c)) >= 4
    assert "# reuse" in c.module.wrapper_source or "reinterpret_tensor" in c.module.wrapper_source
