"""The Triton codegen under TRITON_INTERPRET=1: every result checked against eager."""

from __future__ import annotations

import logging

import kiln_codegen_triton.kernel as tk
import pytest
import torch
from kiln_codegen_triton import TritonCodegen, compile_fx


def run(fn, *args, **tol):
    """Compile ``fn`` through kiln_codegen_triton.compile_fx, check it against eager; return
    the compiled callable (its ``.module`` holds kernels and wrapper)."""
    compiled = compile_fx(torch.fx.symbolic_trace(fn), list(args))
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    actual = compiled(*args)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True, **tol)
    return compiled


def sources(compiled) -> list[str]:
    return [k.source for k in compiled.module.kernels]


# ---------------------------------------------------------------- seed examples


def test_cos_plus_sin_is_one_kernel_one_read_each_one_write():
    c = run(lambda x, y: torch.cos(x) + torch.sin(y), torch.randn(1000), torch.randn(1000))
    (src,) = sources(c)
    assert src.count("tl.load(") == 2 and src.count("tl.store(") == 1
    assert "pointwise1d" in c.module.meta["output_code"] or "pointwise1d" in c.module.wrapper_source


def test_dynamic_sizes_are_kernel_arguments():
    import kiln_loopir
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        y = x.sin()
        return y, y.cos()

    x = torch.randn(4, 6)
    gm = make_fx(f, tracing_mode="symbolic")(x)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))
    module = kiln_loopir.generate_wrapper(sched, TritonCodegen())
    assert "xnumel = s0*s1" in module.wrapper_source
    # named by what it runs (profilers show it), aliased as the name the launcher loads
    assert "def kiln_poi_sin_cos(out_ptr0, out_ptr1, in_ptr0, s0, s1, xnumel" in module.kernels[0].source
    assert "kiln_kernel = kiln_poi_sin_cos" in module.kernels[0].source
    assert module.kernels[0].source.count("tl.store(") == 2
    import kiln_runtime

    call = kiln_runtime.load(module)
    for shape in [(4, 6), (3, 9)]:
        x = torch.randn(shape)
        for a, e in zip(call(x), f(x), strict=True):
            torch.testing.assert_close(a, e)


# ---------------------------------------------------------------- softmax, norms, reductions


@pytest.mark.parametrize("persistent_max", [4096, 4])  # persistent rows, then looped rows
def test_softmax(monkeypatch, persistent_max):
    monkeypatch.setattr(tk, "PERSISTENT_MAX", persistent_max)
    c = run(lambda x: torch.softmax(x, -1), torch.randn(33, 100))
    (src,) = sources(c)
    assert ("for roffset" in src) == (persistent_max < 100)


@pytest.mark.parametrize("persistent_max", [4096, 4])
def test_layernorm_gelu(monkeypatch, persistent_max):
    monkeypatch.setattr(tk, "PERSISTENT_MAX", persistent_max)
    ln = torch.nn.LayerNorm(64).eval()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = ln

        def forward(self, x):
            return torch.nn.functional.gelu(self.ln(x))

    m = M()
    x = torch.randn(8, 5, 64)
    with torch.no_grad():
        c = compile_fx(torch.fx.symbolic_trace(m), [x])
        torch.testing.assert_close(c(x)[0], m(x), atol=1e-5, rtol=1e-5)


REDUCTIONS = {
    "sum": lambda x: x.sum(1),
    "mean": lambda x: x.mean(0),
    "max": lambda x: x.amax(1),
    "min": lambda x: x.amin(0),
    "prod": lambda x: (x * 0.1 + 1).prod(1),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(0),
    "var": lambda x: x.var(1),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "any": lambda x: (x > 1.5).any(1),
    "all": lambda x: (x > -1.5).all(0),
    "full_sum": lambda x: x.sum(),
}


@pytest.mark.parametrize("persistent_max", [4096, 4])
@pytest.mark.parametrize("kind", sorted(REDUCTIONS))
def test_reduction_kinds(monkeypatch, kind, persistent_max):
    monkeypatch.setattr(tk, "PERSISTENT_MAX", persistent_max)
    x = torch.randn(17, 50)
    run(REDUCTIONS[kind], x, atol=1e-4, rtol=1e-4)


def test_max_and_argmax_propagate_nan_first_index_wins():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 5.0, 5.0, 1.0]])
    run(lambda x: (x.amax(1), x.argmax(1), x.argmin(1)), x)


# ---------------------------------------------------------------- index, scatter, cat, layout


def test_index_select_and_gather():
    x, i = torch.randn(10, 6), torch.tensor([3, -1, 0, 9])
    run(lambda x, i: x[i] * 2, x, i)
    run(lambda x, i: torch.gather(x, 1, i), x, torch.randint(0, 6, (10, 3)))


def test_index_put_accumulate_uses_atomics():
    c = run(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
            torch.randn(8, 3), torch.tensor([1, 1, 2, 1]), torch.randn(4, 3))
    assert any("tl.atomic_add(" in s for s in sources(c))


def test_accumulating_scatter_into_one_row_of_a_constant_index():
    """Every row adds into row 0 (an index the graph knows is all zeros: the backward of
    an embedding of constant token ids, RoFormer's training on an H200): the atomic's
    pointers do not depend on the row, so they are widened to the tile (Triton does not
    broadcast them to the values)."""

    def f(g):
        rows = torch.zeros_like(g[:, 0], dtype=torch.long)
        return torch.zeros(2, 32).index_put((rows,), g, accumulate=True)

    c = run(f, torch.randn(32, 32))
    assert any("tl.atomic_add(" in s for s in sources(c))


def test_scatter_add():
    x, i, src = torch.zeros(5, 4), torch.randint(0, 5, (6, 4)), torch.randn(6, 4)
    run(lambda x, i, src: x.scatter_add(0, i, src), x, i, src)


def test_cat():
    run(lambda x, y: torch.cat([x.sin(), y.cos()], 1), torch.randn(4, 5), torch.randn(4, 3))


def test_transpose_uses_a_2d_tile():
    c = run(lambda x: x.permute(1, 0, 2).contiguous() + 1, torch.randn(6, 7, 5))
    (src,) = sources(c)
    assert "YBLOCK" in src


def test_broadcast_add():
    run(lambda x, y: (x + y).relu(), torch.randn(6, 1, 5), torch.randn(1, 4, 5))


def test_fp16_is_computed_in_fp32_and_stored_back():
    x = torch.randn(16, 32, dtype=torch.float16)
    c = run(lambda x: torch.softmax(x, -1) * x, x)
    assert "tl.float32" in sources(c)[0]


def test_integer_semantics():
    a = torch.tensor([-7, 7, -7, 7, 5])
    b = torch.tensor([2, -2, -2, 2, 3])
    run(lambda a, b: (a // b, a % b, torch.fmod(a, b), a.div(b, rounding_mode="trunc")), a, b)


def test_handlers_implement_every_op():
    """A kernel plan's handler and a FlexAttention mod's are whole ops handlers: every op of
    the spec is a method (a spelling of TritonOps' table, or their own memory ops); the
    CLikeOpsHandler base refuses a class that lacks one."""
    from kiln_codegen_triton.flex_attention import ModEmitter
    from kiln_loopir.ops_spec import OPS, missing_ops

    assert missing_ops(tk.TritonKernel) == []
    assert missing_ops(ModEmitter) == []
    assert all(callable(getattr(tk.TritonKernel, name)) for name in OPS)


def test_mm_epilogue_fuses_into_the_next_kernel():
    c = run(lambda x, w, b: torch.relu(x @ w + b), torch.randn(8, 16), torch.randn(16, 4), torch.randn(4))
    assert len(c.module.kernels) == 1  # bias + relu in one Triton kernel after the aten mm


# ---------------------------------------------------------------- kernels that do not load


def test_a_kernel_that_does_not_load_falls_back_to_the_interpreter(monkeypatch, caplog):
    import kiln_codegen_triton.kernel as kmod

    monkeypatch.setattr(kmod, "HELPERS", kmod.HELPERS + "\nthis is not python\n")
    with caplog.at_level(logging.WARNING, logger="kiln"):
        c = run(lambda x: x * 3, torch.randn(5))
    assert "did not compile" in caplog.text
    assert not hasattr(c, "call")  # the loopir interpreter ran it


@pytest.mark.parametrize("kind", ["sum", "rowsum", "max", "prod", "any", "fp16_sum"])
def test_split_reductions_for_few_outputs_and_long_rows(monkeypatch, kind):
    monkeypatch.setattr(tk, "SPLIT_MIN_RNUMEL", 1000)
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 64)
    fn, x = {
        "sum": (lambda x: x.sum(), torch.randn(5000)),
        "rowsum": (lambda x: x.sum(1), torch.randn(3, 5000)),
        "max": (lambda x: x.amax(0), torch.randn(3000, 2)),
        "prod": (lambda x: (x * 0.001 + 1).prod(), torch.randn(3000)),
        "any": (lambda x: (x > 3.5).any(), torch.randn(3000)),
        "fp16_sum": (lambda x: x.sum(), torch.randn(3000, dtype=torch.float16)),
    }[kind]
    c = run(fn, x, atol=1e-2, rtol=1e-3)
    (src,) = sources(c)
    assert "_final(" in src and "kiln_kernel_final = kiln_split_" in src
    assert "tl.program_id(1) * rchunk" in src


def test_autotune_times_each_config_once_and_caches_the_choice_on_disk(monkeypatch, tmp_path):
    """The GPU autotuning path with a stand-in kernel and timer (no GPU here): the fastest
    config wins, written buffers are restored after timing, and a fresh process (empty
    in-memory state) takes the choice from disk without timing again."""
    import kiln_codegen_triton.launcher as L
    import kiln_runtime
    import triton.testing

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(L, "_interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    timings = {512: 1.0, 1024: 2.0}
    timed = []

    def do_bench(fn, warmup, rep):
        fn()
        timed.append(launched[-1])
        return timings[launched[-1]]

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    launched = []

    class Kernel:
        final = None

        def __getitem__(self, grid):
            def launch(out, x, xnumel, XBLOCK, num_warps):
                launched.append(XBLOCK)
                out.add_(1)  # a kernel that accumulates: timing must not change the result
            return launch

        def warmup(self, *args, grid, **kw):
            pass

    spec = L.KernelSpec(source="# stand-in", tiling="pointwise1d",
                        configs=[{"XBLOCK": 1024, "num_warps": 4}, {"XBLOCK": 512, "num_warps": 4}],
                        numels={"xnumel": "xnumel"}, arg_names=["buf0", "arg0", "xnumel"], written=[0])
    out = torch.zeros(8)
    L.TritonLauncher("k", Kernel(), "k.py", spec)(out, torch.zeros(8), 8)
    assert timed == [1024, 512] and launched[-1] == 512
    torch.testing.assert_close(out, torch.ones(8))  # restored, then launched once
    L._CHOSEN.clear()
    before = kiln_runtime.counters["triton_autotune_cache_hits"]
    L.TritonLauncher("k", Kernel(), "k.py", spec)(out, torch.zeros(8), 8)
    assert timed == [1024, 512] and launched[-1] == 512
    assert kiln_runtime.counters["triton_autotune_cache_hits"] == before + 1


def test_lean_launch_calls_the_compiled_kernel_directly_per_specialization(monkeypatch):
    """The GPU launch path with a stand-in JIT function (no GPU here): the first call of a
    specialization goes through Triton's ``run`` (which compiles); later calls launch the
    compiled kernel's ``run`` directly with the grid, the stream, every argument and the
    constexprs in signature order; a new pointer alignment or an integer that becomes 1 goes
    through Triton's ``run`` again (another specialization)."""
    import kiln_codegen_triton.launcher as L

    monkeypatch.setattr(L, "_interpreting", lambda: False)
    monkeypatch.setattr(L, "_lean_launch_enabled", lambda: True)
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: 1234])
    direct, compiled = [], []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def _init_handles(self):
            pass

        def run(self, *launch):
            direct.append(launch)

    class JitFunction:
        arg_names = ["out", "x", "xnumel", "XBLOCK"]
        final = None

        def run(self, *args, grid, warmup, **kw):
            compiled.append((args, grid, kw))
            return Compiled()

    spec = L.KernelSpec(source="# stand-in lean", tiling="pointwise1d",
                        configs=[{"XBLOCK": 128, "num_warps": 4}],
                        numels={"xnumel": "xnumel"}, arg_names=["out", "x", "xnumel"], written=[0])
    launcher = L.TritonLauncher("k", JitFunction(), "k.py", spec)
    out, x = torch.zeros(300), torch.zeros(300)
    launcher(out, x, 300)
    launcher(out, x, 300)
    assert len(compiled) == 1 and compiled[0][1] == (3, 1, 1) and compiled[0][2]["XBLOCK"] == 128
    assert direct == [(3, 1, 1, 1234, "fn", "meta", None, None, None, out, x, 300, 128)]
    launcher(out[1:], x, 299)  # unaligned pointer, another numel: Triton's path again
    assert len(compiled) == 2 and len(direct) == 1
    launcher(out[:1], x, 1)  # an integer argument of 1: another specialization
    assert len(compiled) == 3


# ---------------------------------------------------------------- Welford, online softmax


def run_loopir(fn, *args, **tol):
    """Like ``run`` but traced with torch's core decompositions straight into loopir (aotgrad
    rewrites var/var_mean into two sums; this route keeps them, so Welford is exercised)."""
    import kiln_loopir
    import kiln_runtime
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*args)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, list(args)))
    module = kiln_loopir.generate_wrapper(sched, TritonCodegen())
    call = kiln_runtime.load(module)
    expected = torch.utils._pytree.tree_leaves(fn(*args))
    actual = call(*args)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True, **tol)
    return module


WELFORD = {
    "var": lambda x: x.var(1),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "std_mean_dim0": lambda x: torch.std_mean(x, 0, correction=0),
    "var_all": lambda x: x.var(),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (300,)),
}


@pytest.mark.parametrize("persistent_max", [4096, 16])  # persistent rows, then looped rows
@pytest.mark.parametrize("kind", sorted(WELFORD))
def test_welford_var_of_large_mean_data(monkeypatch, kind, persistent_max):
    """1e4 + randn: E[x^2] - E[x]^2 in fp32 would lose every digit of the variance."""
    monkeypatch.setattr(tk, "PERSISTENT_MAX", persistent_max)
    torch.manual_seed(0)
    x = 1e4 + torch.randn(17, 300)
    # layer_norm's x - mean carries the fp32 rounding of 1e4 (1e-3), in eager as here
    tol = dict(atol=1e-2, rtol=1e-2) if kind == "layer_norm" else dict(atol=1e-3, rtol=1e-3)
    module = run_loopir(WELFORD[kind], x, **tol)
    src = "\n".join(k.source for k in module.kernels)
    looped = persistent_max < 300 or kind == "var_all"
    assert ("1, _kiln_welford)" in src) == looped
    if kind in ("var_mean", "layer_norm") and looped:  # mean and m2 from one state, one loop
        assert src.count("1, _kiln_welford)") == 1
        assert src.count("for roffset") == (1 if kind == "var_mean" else 2)


def test_welford_empty_rows_and_half(monkeypatch):
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    run_loopir(lambda x: torch.var_mean(x, 1), torch.randn(3, 0))
    run_loopir(lambda x: torch.var_mean(x, 1), (100 + torch.randn(5, 40)).half(), atol=2e-2, rtol=2e-2)


def _inf_rows(x):
    x = x.clone()
    x[3] = float("-inf")  # a row of -inf: softmax NaN, logsumexp -inf
    x[5, ::3] = float("-inf")
    x[7, 2] = float("inf")  # +inf: softmax NaN
    return x


ONLINE = {
    # fn, rows the online rewrite saves (loops without it, with it)
    "softmax": (lambda x: torch.softmax(x, -1), (3, 2)),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), (3, 2)),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), (2, 1)),
    "by_hand": (lambda x: torch.exp(x - x.amax(1, keepdim=True)).sum(1), (2, 1)),
    "softmax_inf": (lambda x: torch.softmax(x, -1), (3, 2)),
    "logsumexp_inf": (lambda x: torch.logsumexp(x, -1), (2, 1)),
    "softmax_fp16": (lambda x: torch.softmax(x.half(), -1), (3, 2)),
}


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("kind", sorted(ONLINE))
def test_online_softmax_reads_each_row_twice(monkeypatch, kind, online):
    """A looped sum(exp(x - max)) joins the max's loop, rescaled online: a rule on the IR
    (the by-hand version is matched too), not on the aten op name."""
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    monkeypatch.setattr(tk, "ONLINE_SOFTMAX", online)
    fn, (loops_before, loops_online) = ONLINE[kind]
    x = torch.randn(9, 100) * 4
    if kind.endswith("_inf"):
        x = _inf_rows(x)
    tol = dict(atol=2e-3, rtol=2e-3) if kind.endswith("fp16") else {}
    (src,) = sources(run(fn, x, **tol))
    assert src.count("for roffset") == (loops_online if online else loops_before)


def test_online_softmax_leaves_other_sums_alone(monkeypatch):
    """sum(exp(x - max)) * x is not a pure exp of (a - shift(max)): no rewrite, 3 loops."""
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    fn = lambda x: (torch.exp(x - x.amax(1, keepdim=True)) * x).sum(1)  # noqa: E731
    (src,) = sources(run(fn, torch.randn(9, 100)))
    assert src.count("for roffset") == 2 and "_prev" not in src


def test_row_loop_fusion_shares_one_read(monkeypatch):
    """Independent reductions over the same rows share one loop and one load."""
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    (src,) = sources(run(lambda x: (x.sum(1), x.amax(1), (x * x).sum(1)), torch.randn(9, 100)))
    assert src.count("for roffset") == 1 and src.count("tl.load(") == 1


# ---------------------------------------------------------------- cooperative rows (GPU only)


def _softmax_source(monkeypatch, interpret: bool, x) -> str:
    import kiln_loopir
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.softmax(x, -1), decomposition_table=core_aten_decompositions())(x)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))
    module = kiln_loopir.generate_wrapper(sched, TritonCodegen(interpret=interpret))
    (src,) = [k.source for k in module.kernels]
    return src


def test_cooperative_rows_source(monkeypatch):
    """The cooperative kernel (cooperative.py) as text: K consecutive programs per row,
    partials published, a ticket spin, the K partials combined (max, then the online sum
    rescaled to the row max), then the second loop over this program's chunk only."""
    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "1")
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    monkeypatch.setattr(tk.coop, "MIN_RNUMEL", 64)
    monkeypatch.setattr(tk.coop, "REGISTERS", False)  # the re-read design (registers: test_cooperative_registers.py)
    x = torch.randn(4, 200)
    src = _softmax_source(monkeypatch, False, x)
    for text in ["kchunk = pid % nsplit", "xoffset = (pid // nsplit) * XBLOCK",
                 "rstart = kchunk * rchunk", "ticket = tl.atomic_add(coop_tickets + xoffset, 1, sem='acq_rel')",
                 "target = ticket - ticket % nsplit + nsplit", "while seen < target:",
                 "seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')",
                 "_parts = tl.load(coop_ws + ((xindex * nsplit + sindex) * 3 + 0), smask, other=float(\"-inf\")",
                 "tl.reduce(", "(out_ptr0, in_ptr0, coop_ws, coop_tickets, rchunk, nsplit, XBLOCK", "def kiln_coop_"]:
        assert text in src, text
    assert src.count("for roffset in range(rstart, rend, RBLOCK):") == 2
    # the spin comes after the publishing stores and before the second loop
    assert src.index("tl.store(coop_ws") < src.index("while seen") < src.rindex("for roffset")
    # under the interpreter (programs run one after another) never: the ordinary kernel
    assert "coop_ws" not in _softmax_source(monkeypatch, True, x)


def test_cooperative_rows_one_chunk_runs_under_the_interpreter(monkeypatch):
    """With K = 1 the spin returns at once, so the interpreter can run the cooperative
    kernel's publish / load / combine code end to end against eager."""
    from kiln_codegen_triton import cooperative

    monkeypatch.setattr(tk.coop, "mode", lambda interpret: "spin")
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    monkeypatch.setattr(tk.coop, "MIN_RNUMEL", 64)
    monkeypatch.setattr(cooperative, "CHUNK_BYTES", 1 << 20)
    x = _inf_rows(torch.randn(9, 200) * 4)
    (src,) = sources(run(lambda x: torch.softmax(x, -1), x))
    assert "coop_tickets" in src
    assert cooperative.split_row(200, 64) == (1024 * 256, 1)


def test_cooperative_split_row():
    from kiln_codegen_triton.cooperative import MAX_SPLIT, split_row

    assert split_row(262144, 2048) == (8192, 32)  # 32 KB chunks of a 1 MB fp32 row
    assert split_row(262144, 2048, 64 << 10) == (16384, 16)
    assert split_row(1000, 2048) == (8192, 1)
    chunk, k = split_row(1 << 26, 2048)
    assert k <= MAX_SPLIT and chunk % 2048 == 0 and chunk * k >= 1 << 26
