"""``KILN_LOGS=perf`` (kiln_runtime.profile): timers around each kernel launch and extern call
of a wrapper, compared with the ATen graph's eager ops."""

from types import SimpleNamespace

import torch
from kiln_runtime import load, profile

aten = torch.ops.aten

WRAPPER = '''
import torch

aten = torch.ops.aten


def call(args):
    arg0, arg1 = args
    args.clear()
    buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
    kernel_0(buf0, arg0)
    buf1 = aten.mm.default(buf0, arg1)
    buf2 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
    kernel_1(buf2, buf1)
    return [buf2]
'''


def kernel_0(out, a):
    torch.sin(a, out=out)


def kernel_1(out, a):
    out.copy_(torch.relu(a))


def _aten_graph():
    def f(a, b):
        return (aten.relu.default(aten.mm.default(aten.sin.default(a), b)),)

    return torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))


def _compiled():
    module = SimpleNamespace(source=WRAPPER, namespace={"kernel_0": kernel_0, "kernel_1": kernel_1},
                             kernels=[SimpleNamespace(name="kernel_0"), SimpleNamespace(name="kernel_1")],
                             entry="call", codegen="cpp")
    return load(module)


def test_instrument_source_times_kernels_and_externs_only():
    source, steps = profile.instrument_source(WRAPPER, ["kernel_0", "kernel_1"])
    assert [(s.kind, s.name, s.op) for s in steps] == [
        ("kernel", "kernel_0", "kernel_0"),
        ("extern", "buf1", "aten.mm.default"),
        ("kernel", "kernel_1", "kernel_1"),
    ]
    assert source.count("__kiln_perf_record(") == 3
    assert "empty_strided_cpu((4, 4), (4, 1), torch.float32)" in source  # allocations untimed


def test_disabled_returns_the_compiled_graph_unchanged(monkeypatch):
    monkeypatch.delenv("KILN_LOGS", raising=False)
    compiled = _compiled()
    assert profile.profiled(compiled, _aten_graph()) is compiled


def test_profiled_graph_matches_segments_and_reports(monkeypatch):
    monkeypatch.setenv("KILN_LOGS", "perf")
    profile.reset()
    gm = _aten_graph()
    fn = profile.profiled(_compiled(), gm)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(3):
        (out,) = fn(a, b)
        torch.testing.assert_close(out, torch.relu(torch.sin(a) @ b))
    (prof,) = profile.profiles()
    assert prof.calls == 2 and prof.eager_calls == 2  # the first call is a warm-up
    assert all(s.calls == 2 for s in prof.steps)
    mm_step = prof.steps[1]
    assert prof.op_of(prof.extern_match[mm_step.index]) == "aten.mm.default"
    # kernel_0 shares a segment with eager's sin, kernel_1 with eager's relu
    segs = {tuple(d["kernels"]): d["eager_ops"] for d in prof.segments()}
    assert segs == {("kernel_0",): {"sin": 1}, ("kernel_1",): {"relu": 1}}
    text = profile.report()
    assert "mm (extern)" not in text and "buf1 (extern)" in text and "segment" in text
    assert "eager ATen ops" in text
    profile.reset()
