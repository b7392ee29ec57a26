"""The lowering registry: one lowering per op, aten fallbacks declared per op with a reason,
and a lowering bug raises naming the op (it is never hidden behind an aten call)."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
from kiln_loopir import lowering as L
from kiln_loopir.lowerings import fallbacks as _declared  # noqa: F401  (registers everything)
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def test_duplicate_lowering_is_refused():
    with pytest.raises(ValueError, match="aten::sin.default already has a lowering"):
        L.lowering(aten.sin.default)(lambda x: x)


def test_lowering_for_a_declared_fallback_is_refused():
    with pytest.raises(ValueError, match="already declared an aten fallback"):
        L.lowering(aten.sort.default)(lambda *a: None)


def test_fallback_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        L.fallback(aten.sort.default, reason="")


def test_op_without_lowering_or_declaration_fails_naming_it(monkeypatch):
    monkeypatch.delitem(L.fallbacks, aten.special_i1.default)
    gm = make_fx(lambda x: aten.special_i1.default(x))(torch.randn(4))
    with pytest.raises(L.MissingLowering, match="aten::special_i1.default"):
        K.lower(gm, [torch.randn(4)])


def test_declared_fallback_runs_the_aten_op():
    x = torch.randn(3, 5)
    gm = make_fx(lambda x: aten.sort.default(x, 1)[0] + 1.0)(x)
    graph = K.lower(gm, [x])
    assert any(getattr(b, "fallback", False) for b in graph.buffers)
    torch.testing.assert_close(K.interpret(K.schedule(graph))(x)[0], torch.sort(x, 1)[0] + 1.0)


def test_lowering_bug_raises_naming_the_op(monkeypatch):
    def broken(x):
        raise ZeroDivisionError("oops")

    monkeypatch.setitem(L.lowerings, aten.cos.default, broken)
    gm = make_fx(lambda x: x.cos())(torch.randn(4))
    with pytest.raises(L.LoweringBug, match=r"aten::cos\.default.*ZeroDivisionError: oops"):
        K.lower(gm, [torch.randn(4)])


def test_lowering_disagreeing_with_meta_raises(monkeypatch):
    monkeypatch.setitem(L.lowerings, aten.cos.default,
                        lambda x: K.ir.Pointwise(x.get_device(), torch.float64, x.get_size(),
                                                 x.make_loader()))
    gm = make_fx(lambda x: x.cos())(torch.randn(4))
    with pytest.raises(L.LoweringBug, match=r"aten::cos\.default.*dtype"):
        K.lower(gm, [torch.randn(4)])
