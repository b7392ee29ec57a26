"""Cooperative rows, registers and lagged designs (cooperative.py): each program's chunk is
one block, loaded once and kept in registers across the exchange (registers), or reduced by
one program and normalized by a later one of the same launch (lagged units).

The spin cannot run under the interpreter (programs run one after another), so: the source
as text; K = 1 end to end (no wait); K > 1 with the spin taken out of the source and the
kernel launched twice, the second launch combining the partials the first one published;
the fallback to the ordinary looped kernel under the interpreter. The sm_90 compile of both
designs is in test_cooperative_compile.py.
"""

from __future__ import annotations

import dataclasses

import kiln_codegen_triton.kernel as tk
import pytest
import torch
from kiln_codegen_triton import TritonCodegen, compile_fx, cooperative

FNS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    # a shift that is not the max itself (an infinite max taken as 0): the -inf entries counted
    "logsumexp_plus_x": lambda x: torch.logsumexp(x, -1, keepdim=True) + x,
}


def _inf_rows(x):
    x = x.clone()
    x[1] = float("-inf")  # a row of -inf: NaN as in eager
    x[2, ::3] = float("-inf")
    x[3, :300] = float("-inf")  # whole chunks of -inf in a row that has finite values
    x[4, 7] = float("inf")  # +inf: NaN
    return x


def _module(fn, x, interpret: bool):
    import kiln_loopir
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(x)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))
    return kiln_loopir.generate_wrapper(sched, TritonCodegen(interpret=interpret))


@pytest.fixture
def long_rows(monkeypatch):
    """Rows of 1000 count as long; chunks of 256 elements (1 KB): K = 4 per row."""
    monkeypatch.setattr(tk, "PERSISTENT_MAX", 16)
    monkeypatch.setattr(cooperative, "MIN_RNUMEL", 64)
    monkeypatch.setattr(cooperative, "REGISTER_CONFIGS", ((1, 4, None),))


def test_registers_source(monkeypatch, long_rows):
    """No row loop; the chunk is loaded once; the exchange sits between the reductions and
    the per-element work, which reuses the loaded values."""
    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "1")
    module = _module(FNS["softmax"], torch.randn(6, 1000), interpret=False)
    (kernel,) = module.kernels
    src = kernel.source
    assert "cooperative registers" in kernel.meta["tiling"]
    assert "for roffset" not in src
    for text in ["rstart = kchunk * RBLOCK", "rend = tl.minimum(rstart + RBLOCK, 1000)",
                 "rindex = rstart + tl.arange(0, RBLOCK)[None, :]", "while seen < target:",
                 "tl.static_assert(XBLOCK == 1)", "ticket = tl.atomic_add(coop_tickets + xoffset, 1, sem='acq_rel')",
                 "seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')"]:
        assert text in src, text
    assert src.count("tl.load(in_ptr0") == 1  # one read of the row
    assert src.index("tl.store(coop_ws") < src.index("while seen") < src.index("tl.store(out_ptr0")
    (config,) = kernel.meta["spec"].configs
    assert config == {"XBLOCK": 1, "RBLOCK": 256, "num_warps": 4, "CHUNK_BYTES": cooperative.ONE_BLOCK}
    # KILN_TRITON_COOPERATIVE=reread: the re-read design (two loops over the chunk)
    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "reread")
    (kernel,) = _module(FNS["softmax"], torch.randn(6, 1000), interpret=False).kernels
    assert kernel.source.count("for roffset in range(rstart, rend, RBLOCK):") == 2
    assert "registers" not in kernel.meta["tiling"]


def test_registers_needs_a_config_that_fits(monkeypatch, long_rows):
    """A row needing more than MAX_SPLIT chunks of every configured size: the re-read design."""
    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "1")
    monkeypatch.setattr(cooperative, "MAX_SPLIT", 3)
    (kernel,) = _module(FNS["softmax"], torch.randn(6, 1000), interpret=False).kernels
    assert "cooperative" in kernel.meta["tiling"] and "registers" not in kernel.meta["tiling"]
    assert cooperative.register_configs(1000) == []


def test_split_row_one_block():
    assert cooperative.split_row(262144, 8192, cooperative.ONE_BLOCK) == (8192, 32)
    assert cooperative.split_row(1000, 256, cooperative.ONE_BLOCK) == (256, 4)
    with pytest.raises(ValueError, match="MAX_SPLIT"):
        cooperative.split_row(1 << 30, 8192, cooperative.ONE_BLOCK)
    configs = cooperative.register_configs(262144)
    assert [c["RBLOCK"] for c in configs] == [(kb << 10) // 4 for kb, _, _ in cooperative.REGISTER_CONFIGS]
    assert [c.get("maxnreg") for c in configs] == [cap for _, _, cap in cooperative.REGISTER_CONFIGS]


def test_interpreter_falls_back_to_the_looped_kernel(monkeypatch, long_rows):
    """Under the interpreter the cooperative kernel never runs (its spin would hang): the
    ordinary looped kernel does, and matches eager."""
    from kiln_codegen_triton import compile_fx

    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "1")
    x = _inf_rows(torch.randn(6, 1000) * 4)
    compiled = compile_fx(torch.fx.symbolic_trace(FNS["softmax"]), [x])
    (src,) = [k.source for k in compiled.module.kernels]
    assert "coop_ws" not in src and "for roffset" in src
    torch.testing.assert_close(compiled(x)[0], torch.softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize("name", list(FNS))
def test_registers_one_chunk_runs_under_the_interpreter(monkeypatch, long_rows, name):
    """K = 1 (the chunk covers the row): the spin returns at once, so the interpreter runs
    the registers kernel end to end."""
    from kiln_codegen_triton import compile_fx

    monkeypatch.setattr(cooperative, "mode", lambda interpret: "spin")
    monkeypatch.setattr(cooperative, "REGISTER_CONFIGS", ((4, 4, 32),))  # 1024 elements
    x = _inf_rows(torch.randn(6, 1000) * 4)
    compiled = compile_fx(torch.fx.symbolic_trace(FNS[name]), [x])
    (src,) = [k.source for k in compiled.module.kernels]
    assert "coop_tickets" in src and "for roffset" not in src
    torch.testing.assert_close(compiled(x)[0], FNS[name](x), equal_nan=True)


@pytest.mark.parametrize("name", list(FNS))
def test_registers_four_chunks_combine(monkeypatch, long_rows, name):
    """K = 4 per row under the interpreter: the kernel with its spin taken out, launched
    twice through its launcher (same workspace): the second launch reads the partials every
    program of the first one published, so its output is the full combine's (-inf chunks,
    -inf and +inf rows included)."""
    from kiln_codegen_triton.launcher import load_kernels

    monkeypatch.setattr(cooperative, "mode", lambda interpret: "spin")
    x = _inf_rows(torch.randn(6, 1000) * 4)
    (kernel,) = _module(FNS[name], x, interpret=True).kernels
    spec = kernel.meta["spec"]
    assert "while seen < target:" in spec.source and "for roffset" not in spec.source
    spec = dataclasses.replace(spec, source=spec.source.replace("while seen < target:", "while seen < -(1 << 62):"))
    (launcher,) = load_kernels({"k": spec}).values()
    assert spec.arg_names[1:] == ["arg0"], spec.arg_names
    out = torch.full_like(x, 123.0)
    launcher(out, x)  # publishes every chunk's partials (reads a workspace still filling)
    launcher(out, x)  # the same partials, all there: the real result
    torch.testing.assert_close(out, FNS[name](x), equal_nan=True)
    (ws, tickets) = next(iter(launcher._coop_ws.values()))
    assert ws.numel() == 6 * 4 * 3 and tickets.tolist() == [8] * 6  # K tickets per row per launch


# --------------------------------------------------------------------------------------------
# lagged units (cooperative.py, "Lagged units"; KILN_TRITON_COOPERATIVE=lagged): stats
# units reduce and publish their chunk, normalize units later in the same launch combine the
# row's partials and re-read their chunk. No program waits on a later one, so the kernel runs
# as is under the interpreter (programs in order).
# --------------------------------------------------------------------------------------------
@pytest.fixture
def lagged(monkeypatch, long_rows):
    """Chunks of 256 elements (K = 4 on rows of 1000), lag 2 KB: clamped up to K units."""
    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", "lagged")
    monkeypatch.setattr(cooperative, "LAGGED_CONFIGS", ((1, 4, 0),))


@pytest.mark.parametrize("units, lag", [(1, 1), (8, 2), (24, 4), (24, 24), (40, 7)])
def test_every_unit_runs_once_as_stats_and_once_as_normalize_after_its_row(units, lag):
    k = 2 if units % 2 == 0 else 1
    if lag < k:
        pytest.skip("lag_units keeps the lag at least K")
    seen_stats, seen_norm, stats_at = [], [], {}
    for pid in range(2 * units):
        is_stats, unit = cooperative.lagged_unit(pid, units, lag)
        if is_stats:
            seen_stats.append(unit)
            stats_at[unit] = pid
        else:
            seen_norm.append(unit)
            row = unit // k
            assert all(stats_at.get(row * k + j, 1 << 30) < pid for j in range(k)), (pid, unit)
    assert sorted(seen_stats) == list(range(units)) and sorted(seen_norm) == list(range(units))


def test_lagged_source(lagged):
    module = _module(FNS["softmax"], torch.randn(6, 1000), interpret=False)
    (kernel,) = module.kernels
    src = kernel.source
    assert "cooperative registers lagged" in kernel.meta["tiling"]
    assert "for roffset" not in src and "while seen < target:" in src
    stats, normalize = src[src.index("def kiln_coop"):].split("\n    else:\n")
    assert "if is_stats:" in stats and "tl.atomic_add(coop_tickets + xoffset, 1, sem='release')" in stats
    assert stats.count("tl.exp(") == 2  # one per element, and the all -inf chunk's term
    assert "anyninf = tl.max(" not in stats  # softmax's shift is its max: no second reduction
    assert "eviction_policy='evict_last'" in stats and "tl.store(out_ptr0" not in stats
    assert "tl.store(out_ptr0" in normalize and "eviction_policy='evict_first'" in normalize
    (config,) = kernel.meta["spec"].configs
    assert config["LAG_BYTES"] == 0 and config["CHUNK_BYTES"] == cooperative.ONE_BLOCK


@pytest.mark.parametrize("name", list(FNS))
def test_lagged_kernel_runs_under_the_interpreter_and_launches_again(lagged, name):
    """K = 4 chunks per row, -inf chunks and rows, +inf: eager's result, twice through the
    same workspace and counters (a CUDA-graph replay's arguments)."""
    x = _inf_rows(torch.randn(6, 1000) * 4)
    compiled = compile_fx(torch.fx.symbolic_trace(FNS[name]), [x])
    (kernel,) = compiled.module.kernels
    assert "lagged" in kernel.meta["tiling"]
    for _ in range(2):
        torch.testing.assert_close(compiled(x)[0], FNS[name](x), equal_nan=True)


def test_lag_units_is_at_least_k_and_at_most_every_unit():
    assert cooperative.lag_units(10 << 20, 8192, 32, 32 * 1024) == (10 << 20) // (8192 * 4)
    assert cooperative.lag_units(0, 8192, 32, 32 * 1024) == 32
    assert cooperative.lag_units(1 << 40, 8192, 32, 320) == 320
