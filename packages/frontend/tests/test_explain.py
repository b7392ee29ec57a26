"""``kiln_frontend.explain`` and the recompile log."""

from __future__ import annotations

import logging

import kiln_frontend
import pytest
import torch
from kiln_frontend import config

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


TOY_IF_LINE = toy_example.__code__.co_firstlineno + 2


def test_explain_toy_example():
    # b.sum() > 0: the branch is not taken, so the resume graph is the one multiply
    out = kiln_frontend.explain(toy_example)(torch.randn(10), torch.rand(10) + 0.1)
    assert isinstance(out, kiln_frontend.ExplainOutput)
    assert out.graph_count == 2 and len(out.graphs) == 2
    assert out.graph_break_count == 1
    (brk,) = out.break_reasons
    assert brk.reason == "data-dependent branch on a tensor"
    assert brk.filename == __file__ and brk.lineno == TOY_IF_LINE
    assert brk.source_line == "if b.sum() < 0"
    assert brk.frame == "toy_example" and brk.frame_captured
    assert out.ops_per_graph[0] == ["torch.abs", "operator.add", "operator.truediv",
                                    "Tensor.sum", "operator.lt"]
    assert out.ops_per_graph[1] == ["operator.mul"]
    assert out.op_count == 6
    guards = [str(g).strip() for g in out.out_guards]
    assert "- local 'a' TENSOR_MATCH" in guards and "- global 'torch' FUNCTION_MATCH" in guards
    text = str(out)
    assert text.startswith("Graph Count: 2\nGraph Break Count: 1\nOp Count: 6\n")
    assert "    Reason: data-dependent branch on a tensor\n" in text
    assert f"    Location: {__file__}:{TOY_IF_LINE} (frame toy_example)\n" in text
    assert "      if b.sum() < 0\n" in text
    assert "  Ops 2:\n    operator.mul\n" in text
    assert "  Guard 3: local 'a' TENSOR_MATCH" in text


def no_breaks(x):
    return torch.relu(x) * 2


def test_explain_no_breaks_and_state_is_reset():
    out = kiln_frontend.explain(no_breaks)(torch.randn(3))
    assert (out.graph_count, out.graph_break_count, out.op_count) == (1, 0, 2)
    assert "Break Reasons" not in str(out)
    # explain resets before and after: a second explain captures again
    out2 = kiln_frontend.explain(no_breaks)(torch.randn(3))
    assert out2.graph_count == 1


def prints_in_loop(x):
    for _ in range(2):
        print("", end="")
        x = x + 1
    return x


def test_explain_frame_not_captured():
    out = kiln_frontend.explain(prints_in_loop)(torch.randn(2))
    assert out.graph_count == 0
    (brk,) = out.break_reasons
    assert not brk.frame_captured
    assert brk.reason == "call to builtin print"
    assert brk.lineno == prints_in_loop.__code__.co_firstlineno + 2
    assert "The frame was not captured; it runs as plain Python." in str(out)


def helper_that_breaks(x):
    return x.sum().tolist()


def calls_helper(x):
    y = x * 2
    n = helper_that_breaks(y)
    return y + n


def test_explain_break_inside_inlined_call_names_the_inner_line():
    out = kiln_frontend.explain(calls_helper)(torch.randn(3))
    reasons = [b for b in out.break_reasons if b.frame == "calls_helper"]
    assert reasons, out
    assert reasons[0].lineno == helper_that_breaks.__code__.co_firstlineno + 1
    assert "tolist()" in reasons[0].reason


def test_explain_extra_args_and_dynamic_guards():
    def f(x, scale):
        return x * scale

    out = kiln_frontend.explain(f, torch.randn(2))(3.0)
    assert out.graph_count == 1
    assert any("CONSTANT_MATCH" in str(g) for g in out.out_guards)


def test_recompile_reason_logged_and_printed(caplog, capsys):
    calls = []

    def backend(gm, ex):
        calls.append(gm)
        return gm.forward

    f = kiln_frontend.compile(no_breaks, backend=backend, dynamic=False)
    with config.patch(log_recompiles=True), caplog.at_level(logging.INFO,
                                                            logger="kiln.recompiles"):
        f(torch.randn(3))
        f(torch.randn(3))
        f(torch.randn(4))
    msgs = [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]
    assert len(msgs) == 1
    assert "Recompiling function no_breaks" in msgs[0]
    assert "tensor L['x'] size mismatch at index 0: expected 3, actual 4" in msgs[0]
    assert "[kiln.recompiles]" in capsys.readouterr().err
    assert len(calls) == 2
