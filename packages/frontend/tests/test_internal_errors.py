"""When kiln itself fails while capturing a frame (an exception in the symbolic interpreter,
bytecode or guards that do not build), the frame runs eagerly, one log line says it is
kiln's bug and how to report it, and ``explain`` lists it apart from graph breaks."""

from __future__ import annotations

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import config, convert, eval_frame
from kiln_frontend.bytecode import BytecodeError
from kiln_frontend.bytecode import versions as bytecode_versions
from kiln_frontend.exc import BUG_REPORT_HINT, InternalError
from kiln_frontend.symbolic import registry

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def fn(x, y):
    a = torch.sin(x)
    b = a * y  # BINARY_OP: the handler the tests break
    return torch.relu(b)


BINARY_OP_LINE = fn.__code__.co_firstlineno + 2


@pytest.fixture
def broken_binary_op(monkeypatch):
    """The BINARY_OP handler raises as a kiln bug would."""

    def broken(tx, inst):
        raise RuntimeError("deliberately broken BINARY_OP handler")

    table = registry._HANDLERS["BINARY_OP"]
    monkeypatch.setitem(table, bytecode_versions.PY_VERSION, broken)


def _inputs():
    return torch.randn(4), torch.randn(4)


def test_tracer_bug_runs_eagerly_and_says_so(broken_binary_op, capsys):
    backend = CountingBackend()
    compiled = kiln_frontend.compile(fn, backend=backend)
    x, y = _inputs()
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    torch.testing.assert_close(compiled(y, x), fn(y, x))  # marked skip: plain Python now
    assert backend.graphs == []
    assert eval_frame.counters["internal_errors"] == 1
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("[kiln.internal_errors]")]
    assert len(line) == 1
    assert (f"kiln internal error while tracing fn ({__file__}:{BINARY_OP_LINE}): "
            "RuntimeError: deliberately broken BINARY_OP handler") in line[0]
    assert BUG_REPORT_HINT in line[0]
    assert line[0].endswith("The frame runs eagerly.")


def test_explain_lists_internal_errors_apart_from_graph_breaks(broken_binary_op):
    x, y = _inputs()
    out = kiln_frontend.explain(fn)(x, y)
    assert out.graph_count == 0
    assert out.graph_break_count == 0 and out.break_reasons == []
    (err,) = out.internal_errors
    assert err.frame == f"fn ({__file__}:{BINARY_OP_LINE})"
    assert err.phase == "tracing"
    assert err.error == "RuntimeError: deliberately broken BINARY_OP handler"
    text = str(out)
    assert "Internal Errors (bugs in kiln; these frames ran eagerly):\n" in text
    assert BUG_REPORT_HINT in text


def test_graph_break_and_internal_error_in_one_call(broken_binary_op):
    def g(x):
        y = torch.cos(x)
        print("", end="")  # a graph break: the rest is a resume function
        return y * 2  # the resume function's BINARY_OP is broken

    x = torch.randn(3)
    out = kiln_frontend.explain(g)(x)
    assert out.graph_count == 1 and out.graph_break_count == 1
    assert len(out.internal_errors) == 1
    assert out.internal_errors[0].frame.startswith("__resume_at_")
    torch.testing.assert_close(kiln_frontend.compile(g, backend=CountingBackend())(x), g(x))


def test_bytecode_that_does_not_assemble_runs_eagerly(monkeypatch, capsys):
    def broken_assemble(*args, **kwargs):
        raise BytecodeError("deliberately broken assembler")

    monkeypatch.setattr(convert, "assemble", broken_assemble)
    backend = CountingBackend()
    x, y = _inputs()
    torch.testing.assert_close(kiln_frontend.compile(fn, backend=backend)(x, y), fn(x, y))
    assert eval_frame.counters["internal_errors"] == 1
    assert eval_frame.counters["compiles"] == 0
    err = capsys.readouterr().err
    assert "kiln internal error while assembling the bytecode of fn (" in err
    assert "BytecodeError: deliberately broken assembler" in err


def test_guards_that_do_not_build_run_eagerly(monkeypatch):
    def broken_guards(*args, **kwargs):
        raise SyntaxError("deliberately broken guard code")

    monkeypatch.setattr(convert, "build_check_fn", broken_guards)
    x, y = _inputs()
    out = kiln_frontend.explain(fn)(x, y)
    (err,) = out.internal_errors
    assert err.phase == "building the guards of"
    torch.testing.assert_close(kiln_frontend.compile(fn, backend=CountingBackend())(x, y),
                               fn(x, y))


def test_internal_error_raises_without_suppress_errors(broken_binary_op):
    x, y = _inputs()
    with config.patch(suppress_errors=False):
        with pytest.raises(InternalError, match="This is a bug in kiln") as info:
            kiln_frontend.compile(fn, backend=CountingBackend())(x, y)
    assert isinstance(info.value.inner, RuntimeError)
    assert info.value.phase == "tracing"


def test_verbose_prints_the_traceback(broken_binary_op, capsys):
    x, y = _inputs()
    with config.patch(verbose=True):
        kiln_frontend.compile(fn, backend=CountingBackend())(x, y)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "in broken" in err


def test_ordinary_graph_break_is_not_an_internal_error():
    def h(x):
        if x.sum() > 0:  # data-dependent branch: a graph break, not a kiln bug
            return x + 1
        return x - 1

    out = kiln_frontend.explain(h)(torch.ones(3))
    assert out.internal_errors == []
    assert out.graph_break_count == 1
