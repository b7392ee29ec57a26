"""Dynamic shapes (kiln_frontend/shapes.py): dynamic=True, mark_dynamic, automatic dynamic,
SymInt nodes, shape guards and their failure reasons."""

from __future__ import annotations

import logging

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import eval_frame
from kiln_frontend.guards import GuardKind

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def checks(compiled):
    """The check functions of the compiled function's cache entries."""
    return [entry[0] for entry in eval_frame.cache_entries(compiled._kiln_orig.__code__)]


def sizes_of(node):
    return [str(s) for s in node.meta["example_value"].shape]


def seed(x):
    y = x.sin()
    z = y.cos()
    return y, z


def test_seed_example_one_graph_over_s0_s1():
    rec = CountingBackend()
    f = kiln_frontend.compile(seed, backend=rec, dynamic=True)
    for shape in [(3, 5), (7, 2), (4, 9), (2, 2)]:
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), seed(x))
    assert len(rec.graphs) == 1
    gm = rec.graphs[0]
    nodes = list(gm.graph.nodes)
    (ph,) = [n for n in nodes if n.op == "placeholder"]
    assert sizes_of(ph) == ["s0", "s1"]
    for n in nodes:
        if n.op == "call_method":
            assert sizes_of(n) == ["s0", "s1"]
    assert all(isinstance(s, torch.SymInt) for s in ph.meta["example_value"].shape)
    # the backend gets the real tensor; the symbols are in meta["example_value"]
    (ex,) = rec.example_inputs[0]
    assert type(ex) is torch.Tensor and ex.shape == (3, 5)
    assert "f32[s0, s1]" in gm.print_readable(print_output=False)


def test_sizes_zero_and_one_are_specialized():
    rec = CountingBackend()
    f = kiln_frontend.compile(seed, backend=rec, dynamic=True)
    f(torch.randn(1, 5))
    (ph,) = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"]
    assert sizes_of(ph) == ["1", "s0"]
    f(torch.randn(1, 7))  # same entry: dim 1 is a symbol
    assert len(rec.graphs) == 1
    f(torch.randn(3, 7))  # dim 0 was specialized to 1: recompile
    assert len(rec.graphs) == 2


def size_arithmetic(x):
    n = x.shape[0] * 2
    return x.view(n, -1) + x.size(1), n


def test_size_arithmetic_becomes_symint_nodes():
    rec = CountingBackend()
    f = kiln_frontend.compile(size_arithmetic, backend=rec, dynamic=True)
    for shape in [(4, 6), (6, 8), (3, 10)]:
        x = torch.randn(shape)
        out, n = f(x)
        ref, ref_n = size_arithmetic(x)
        torch.testing.assert_close(out, ref)
        assert n == ref_n and type(n) is int
    assert len(rec.graphs) == 1
    gm = rec.graphs[0]
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # x, then the lifted symbols it reads (a Sym placeholder per size used)
    assert [n.name for n in phs] == ["x", "s0", "s1"]
    assert all(isinstance(n.meta["example_value"], torch.SymInt) for n in phs[1:])
    muls = [n for n in gm.graph.nodes if n.op == "call_function" and "mul" in str(n.target)]
    assert str(muls[0].meta["example_value"]) == "2*s0"
    # example inputs: the real tensor, then SymInts for the symbol placeholders
    ex = rec.example_inputs[0]
    assert isinstance(ex[0], torch.Tensor) and isinstance(ex[1], torch.SymInt)


def branch_on_size(x):
    if x.shape[0] > 4:
        return x * 2
    return x - 1


def test_branch_on_size_is_a_shape_guard_with_readable_reason():
    rec = CountingBackend()
    f = kiln_frontend.compile(branch_on_size, backend=rec, dynamic=True)
    for n in (5, 6, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), branch_on_size(x))
    assert len(rec.graphs) == 1
    (check,) = checks(f)
    texts = [str(g) for g in check.guards if g.kind is GuardKind.SHAPE_ENV]
    assert " - shape L['x'].size()[0] > 4 SHAPE_ENV" in texts
    reason = check.failure_reason(torch.randn(3, 3))
    assert reason.startswith("shape guard L['x'].size()[0] > 4 failed (L['x'].size()[0] = 3)")
    assert "test_dynamic_shapes.py" in reason  # where the assumption was made
    x = torch.randn(3, 3)
    torch.testing.assert_close(f(x), branch_on_size(x))
    assert len(rec.graphs) == 2


def test_check_function_code_reads_sizes():
    f = kiln_frontend.compile(seed, backend=CountingBackend(), dynamic=True)
    f(torch.randn(3, 5))
    (check,) = checks(f)
    assert "x.size()[0] >= 2" in check.code
    assert "x.stride() == (x.size()[1], 1)" in check.code
    # non-contiguous input: the stride guard fails and says so
    reason = check.failure_reason(torch.randn(5, 3).t())
    assert reason.startswith("shape guard L['x'].stride() == (L['x'].size()[1], 1) failed")


def test_mark_dynamic_only_that_dim():
    rec = CountingBackend()
    f = kiln_frontend.compile(seed, backend=rec)
    for b in (3, 5, 8):
        x = torch.randn(b, 4)
        kiln_frontend.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), seed(x))
    assert len(rec.graphs) == 1
    (ph,) = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"]
    assert sizes_of(ph) == ["s0", "4"]
    x = torch.randn(3, 5)
    kiln_frontend.mark_dynamic(x, 0)
    f(x)  # dim 1 is static: recompile
    assert len(rec.graphs) == 2


def test_mark_dynamic_validates_and_mark_static_undoes():
    x = torch.randn(2, 3)
    with pytest.raises(IndexError):
        kiln_frontend.mark_dynamic(x, 2)
    kiln_frontend.mark_dynamic(x, [0, -1])
    assert x._kiln_dynamic_dims == {0, 1}
    kiln_frontend.mark_static(x, 1)
    assert x._kiln_dynamic_dims == {0}


def add_rows(x, y):
    return (x * 2).sum(0) + y


def test_automatic_dynamic_after_one_recompile(caplog):
    rec = CountingBackend()
    f = kiln_frontend.compile(add_rows, backend=rec)
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        for b in (3, 5, 7, 11):
            x, y = torch.randn(b, 4), torch.randn(4)
            torch.testing.assert_close(f(x, y), add_rows(x, y))
    assert len(rec.graphs) == 2
    (ph0,) = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"][:1]
    assert sizes_of(ph0) == ["3", "4"]  # first compile: static
    ph1 = [n for n in rec.graphs[1].graph.nodes if n.op == "placeholder"][0]
    assert sizes_of(ph1) == ["s0", "4"]  # the size that changed is now a symbol
    msgs = [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]
    assert len(msgs) == 1
    assert "tensor L['x'] size mismatch at index 0: expected 3, actual 5" in msgs[0]


def test_dynamic_false_disables_automatic_dynamic():
    rec = CountingBackend()
    f = kiln_frontend.compile(add_rows, backend=rec, dynamic=False)
    for b in (3, 5, 7):
        f(torch.randn(b, 4), torch.randn(4))
    assert len(rec.graphs) == 3
    for gm in rec.graphs:
        ph = [n for n in gm.graph.nodes if n.op == "placeholder"][0]
        assert all(isinstance(s, int) for s in ph.meta["example_value"].shape)


def test_duck_sizing_equal_sizes_share_a_symbol():
    rec = CountingBackend()

    def f(x, y):
        return x + y

    cf = kiln_frontend.compile(f, backend=rec, dynamic=True)
    cf(torch.randn(4), torch.randn(4))
    phs = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"]
    assert sizes_of(phs[0]) == sizes_of(phs[1]) == ["s0"]
    (check,) = checks(cf)
    assert any(str(g) == " - shape L['y'].size()[0] == L['x'].size()[0] SHAPE_ENV"
               for g in check.guards)
    x, y = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(cf(x, y), x + y)
    assert len(rec.graphs) == 1


def test_recompile_log_names_the_shape_guard(caplog):
    rec = CountingBackend()
    f = kiln_frontend.compile(branch_on_size, backend=rec, dynamic=True)
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        f(torch.randn(6, 2))
        f(torch.randn(2, 2))
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]
    assert "shape guard L['x'].size()[0] > 4 failed (L['x'].size()[0] = 2)" in msg


def shape_with_break(x):
    n = x.shape[0] + 1
    print("", end="")
    return x.sum() * n


def test_symint_live_across_a_graph_break():
    rec = CountingBackend()
    f = kiln_frontend.compile(shape_with_break, backend=rec, dynamic=True)
    for b in (3, 4):
        x = torch.randn(b, 2)
        torch.testing.assert_close(f(x), shape_with_break(x))


def test_graph_with_only_symbolic_sizes_returns_ints():
    def f(x):
        return x.numel() * 2, x.shape[1] - 1

    rec = CountingBackend()
    cf = kiln_frontend.compile(f, backend=rec, dynamic=True)
    assert cf(torch.randn(3, 4)) == (24, 3)
    assert cf(torch.randn(5, 6)) == (60, 5)
    assert len(rec.graphs) == 1


def test_no_shape_env_for_static_frames():
    rec = CountingBackend()
    f = kiln_frontend.compile(seed, backend=rec, dynamic=False)
    f(torch.randn(2, 3))
    ph = [n for n in rec.graphs[0].graph.nodes if n.op == "placeholder"][0]
    assert ph.meta["example_value"].fake_mode.shape_env is None
