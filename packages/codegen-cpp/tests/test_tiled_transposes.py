"""Transposing copies (loads contiguous along one loop, stores along another) run in 2-D tiles;
pointwise dims read as ``i // 64`` and ``i % 64`` split into two loops. Every result is checked
against eager and against the loopir interpreter; the tiled path is checked by its marker."""

import kiln_codegen_cpp.kernel as cpp_kernel
import kiln_loopir
import pytest
import sympy
import torch
from cpp_test_utils import G, check
from kiln_codegen_cpp import compile_fx
from kiln_codegen_cpp.compiler import vectorized_loops
from kiln_loopir.kernel_plan import access_strides, collapse_outer_loops, transposed_loops
from kiln_loopir.sizevars import FloorDiv, ModularIndexing, index_symbol
from kiln_loopir.virtualized import ops
from test_pipeline import run

MARKER = "// tiled transpose:"


def tiled(compiled) -> list[str]:
    return [k.meta["body"] for k in compiled.module.kernels if MARKER in k.meta["body"]]


def _t2(x):
    return x.t().contiguous()


def _t3(x):
    return x.transpose(1, 2).contiguous()


def _nchw_to_nhwc(x):
    return x.permute(0, 2, 3, 1).contiguous()


def _nhwc_to_nchw(x):
    return x.permute(0, 3, 1, 2).contiguous()


def _key_transpose(x):
    return x.transpose(-1, -2).contiguous()


@pytest.mark.parametrize("fn, shape, edge, full", [
    (_t2, (64, 96), False, True),                # whole tiles only
    (_t2, (37, 45), True, True),                 # odd sizes: edge tiles on both loops
    (_t3, (3, 33, 70), True, True),
    (_nchw_to_nhwc, (2, 19, 9, 11), True, False),  # a loop shorter than a tile: edges only
    (_nhwc_to_nchw, (2, 9, 11, 19), True, False),
    (_nhwc_to_nchw, (2, 8, 8, 64), False, True),
    (_key_transpose, (2, 3, 40, 24), True, False),
])
def test_transposes_are_tiled_and_correct(fn, shape, edge, full):
    """Full tiles of a plain copy transpose 16x16 blocks in registers; edge tiles loop."""
    c = run(fn, torch.randn(shape))
    (body,) = tiled(c)
    assert ("#pragma omp simd" in body) == edge
    assert ("kiln_transpose16_32(&" in body) == full


def test_tile_inner_loop_vectorizes():
    """A transposing copy that computes (no register transposes): the tile's loop vectorizes."""
    c = run(lambda x: x.t().contiguous() * 2, torch.randn(64, 96))
    (k,) = c.module.kernels
    inner = [ln.strip() for ln in k.meta["body"].splitlines() if ln.strip().startswith("for (")][-1]
    assert inner.startswith("for (int64_t i0 = i0_begin") or inner.startswith("for (int64_t i1 = i1_begin")
    assert inner in vectorized_loops(k.source)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool])
def test_every_dtype(dtype):
    x = torch.randn(37, 45) * 50
    x = x > 0 if dtype == torch.bool else x.to(dtype)
    c = run(_t2, x)
    (body,) = tiled(c)
    # 2- and 4-byte elements: full tiles move bits in registers (a half copy is lowered as
    # half -> float -> half; the round trip is recognized as a copy)
    bits = {torch.float16: 16, torch.bfloat16: 16, torch.int32: 32}.get(dtype)
    assert ("kiln_transpose16_" in body) == (bits is not None)
    if bits:
        assert f"kiln_transpose16_{bits}(&" in body


def test_fused_epilogue_is_tiled():
    """A transposed operand plus a contiguous one, then a bias and a GELU: one tiled kernel."""

    def f(x, y, b):
        return torch.nn.functional.gelu(x.transpose(1, 2) + y + b)

    c = run(f, torch.randn(2, 33, 50), torch.randn(2, 50, 33), torch.randn(33))
    (body,) = tiled(c)
    assert "kiln_erf" in body


def test_contiguous_innermost_dim_is_not_tiled():
    """The attention head merge keeps its last dim: loads and stores agree, no tiles."""
    c = run(lambda x: x.permute(0, 2, 1, 3).contiguous(), torch.randn(2, 3, 40, 24))
    assert tiled(c) == []


def test_reductions_are_untouched():
    c = run(lambda x: (x.t() * 2).softmax(-1), torch.randn(48, 40))
    assert tiled(c) == []


def test_dynamic_sizes_tiles_with_symbolic_edges():
    c = run(_t3, torch.randn(2, 33, 70), dynamic=True)
    (body,) = tiled(c)
    assert "if (" in body  # full tiles and edge tiles: the sizes are not known statically
    for shape in [(1, 5, 7), (3, 64, 32), (2, 31, 97)]:
        x = torch.randn(shape)
        (got,) = c(x)
        torch.testing.assert_close(got, _t3(x))


def test_dynamic_permute_bias():
    def f(x, b):
        return (x.permute(0, 2, 3, 1) + b).contiguous()

    c = run(f, torch.randn(2, 19, 9, 11), torch.randn(19), dynamic=True)
    assert len(tiled(c)) == 1
    for shape in [(1, 40, 5, 3), (2, 16, 32, 32)]:
        x, b = torch.randn(shape), torch.randn(shape[1])
        (got,) = c(x, b)
        torch.testing.assert_close(got, f(x, b))


def test_switch_off_restores_the_flat_loops(monkeypatch):
    monkeypatch.setattr(cpp_kernel, "TILED_TRANSPOSES", False)
    c = run(_t2, torch.randn(37, 45))
    assert tiled(c) == []


def test_access_strides_and_transposed_loops():
    i0, i1, i2 = (index_symbol(k) for k in range(3))
    assert access_strides(98304 * i0 + 64 * i1 + i2, [i0, i1, i2]) == {i0: 98304, i1: 64, i2: 1}
    strides = access_strides(sympy.sympify(i0) + FloorDiv(i1, 64), [i0, i1])
    assert strides == {i0: 1, i1: None}

    class Deps:  # what body_deps gives: reads/writes with .name .index .mode
        def __init__(self, reads, writes):
            self.reads, self.writes = reads, writes

    dep = kiln_loopir.ir.MemoryDep
    ranges = [sympy.Integer(4), sympy.Integer(64), sympy.Integer(96)]
    copy = Deps([dep("x", i0 * 6144 + i1 + 64 * i2)], [dep("y", i0 * 6144 + 96 * i1 + i2)])
    assert transposed_loops(ranges, [copy]) == (1, 2)
    same = Deps([dep("x", i0 * 6144 + 96 * i1 + i2)], [dep("y", i0 * 6144 + 96 * i1 + i2)])
    assert transposed_loops(ranges, [same]) is None
    short = [sympy.Integer(4), sympy.Integer(3), sympy.Integer(96)]
    assert transposed_loops(short, [Deps([dep("x", i0 * 288 + i1 + 3 * i2)],
                                         [dep("y", i0 * 288 + 96 * i1 + i2)])]) is None


def test_flat_dim_read_through_floordiv_and_modulo_splits():
    """A store over ``[b, t, h*d]`` reading ``x[b, i // d, t, i % d]`` (the head merge of
    ``(x.permute(0, 2, 1, 3) + bias).reshape(b, t, h*d)`` lowered over the view's shape):
    split into [h, d] every access is affine again and the innermost loop a plain d-wide one."""
    x, bias = torch.randn(2, 12, 40, 64), torch.randn(64)
    g = G(x, bias)
    out = g.pointwise([2, 40, 768], lambda i: ops.add(
        g.load(0, [i[0], FloorDiv(i[2], 64), i[1], ModularIndexing(i[2], 1, 64)]),
        g.load(1, [ModularIndexing(i[2], 1, 64)])), torch.float32)
    sched = g.schedule([out])
    fn = check(sched, [x, bias], [(x.permute(0, 2, 1, 3) + bias).reshape(2, 40, 768)])
    (group,) = sched.groups
    unsplit, _, _ = collapse_outer_loops(group)
    split, index, deps = collapse_outer_loops(group, split=True)
    assert [str(r) for r in unsplit] == ["2", "40", "768"]
    assert [str(r) for r in split] == ["2", "40", "12", "64"]
    assert [str(e) for e in index] == ["i0", "i1", "64*i2 + i3"]
    assert not any("//" in str(m.index) or "Modular" in str(m.index)
                   for d in deps for m in (*d.reads, *d.writes))
    (k,) = fn.module.kernels
    assert "for (int64_t i3 = 0; i3 < 64; i3++)" in k.meta["body"]


def test_short_split_is_refused():
    """``x[i // 3]`` (repeat_interleave) would leave a 3-long innermost loop: not split."""
    x = torch.randn(100)
    g = G(x)
    out = g.pointwise([300], lambda i: g.load(0, [FloorDiv(i[0], 3)]), torch.float32)
    sched = g.schedule([out])
    check(sched, [x], [x.repeat_interleave(3)])
    assert [str(r) for r in collapse_outer_loops(sched.groups[0], split=True)[0]] == ["300"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_register_transpose_moves_every_bit_pattern(dtype):
    """All 65536 patterns (NaNs included) come out bit for bit, as eager's copy."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    c = compile_fx(torch.fx.symbolic_trace(_t2), [x])
    assert "kiln_transpose16_16(&" in c.module.kernels[0].meta["body"]
    (got,) = c(x)
    assert torch.equal(got.view(torch.int16), _t2(x).view(torch.int16))
