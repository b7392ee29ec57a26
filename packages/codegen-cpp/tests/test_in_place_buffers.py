"""The memory plan writes a kernel's result over a buffer the kernel reads for the last time
(``Allocation.in_place``) and lends an extern's result (a convolution's, a matmul's) to later
buffers. Without it, every convolution's BatchNorm+SiLU epilogue, squeeze-excite gate and
residual add allocated a fresh buffer: a higher peak that glibc gave back to the OS at the end
of each call and page-faulted in again on the next (EfficientNet-B0 at batch 2: ~5000 page
faults, ~20% of a call, where inductor's in-place buffers had none)."""

from __future__ import annotations

import kiln_aotgrad
import kiln_loopir
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx, compile_schedule
from kiln_loopir.ir import ExternKernel, FusedGroup


def _schedule(fn, *inputs):
    gm = torch.fx.symbolic_trace(fn)
    with torch.no_grad():
        return gm, kiln_loopir.schedule(kiln_loopir.lower(kiln_aotgrad.trace_inference(gm, list(inputs))))


def _in_place(sched):
    return [(s, a) for s in sched.steps if isinstance(s, FusedGroup) for a in s.allocations if a.in_place]


def _check(fn, *inputs):
    gm, sched = _schedule(fn, *inputs)
    sched.lint()
    with torch.no_grad():
        want = fn(*inputs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        got = compile_schedule(sched)(*inputs)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        oracle = kiln_loopir.interpret(sched)(*inputs)  # the IR interpreter honours the plan too
        for g, w in zip(oracle, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    return sched


class ConvBnSiLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        y = F.silu(self.conv(x))  # written over the conv's result
        return self.conv2(y) + y  # the residual add: over one of its inputs


def test_conv_epilogue_writes_over_the_conv_result():
    torch.manual_seed(0)
    m, x = ConvBnSiLU().eval(), torch.randn(2, 8, 9, 11).to(memory_format=torch.channels_last)
    sched = _check(m, x)
    pairs = _in_place(sched)
    externs = {s.name for s in sched.steps if not isinstance(s, FusedGroup)}
    assert len(pairs) == 2, [str(a) for _, a in pairs]
    assert pairs[0][1].reuses in externs  # SiLU over the conv's result; the add over either input
    # both pointers of the pair alias: neither is __restrict__ in the kernel
    group, alloc = pairs[0]
    (kernel,) = [k for k in compile_schedule(sched).module.kernels if k.group is group]
    params = kernel.meta["body"].split("{", 1)[0]
    assert params.count("__restrict__") == params.count("*") - 2, params


def test_matmul_result_reshaped_in_place():
    """The 2-D matmul result is the storage of the 3-D buffer written over it (same storage
    positions, another shape)."""
    w = torch.randn(32, 24)

    def f(x):
        return torch.relu(torch.mm(x.reshape(-1, 32), w).reshape(4, 6, 24)) * 3.0

    sched = _check(f, torch.randn(4, 6, 32))
    ((_, alloc),) = _in_place(sched)
    assert isinstance(sched.graph.get_buffer(alloc.reuses), ExternKernel)


@pytest.mark.parametrize("case", ["flip", "softmax", "transpose"])
def test_no_in_place_when_other_elements_are_read(case):
    """A kernel that reads the dying buffer at another element than it stores (a flip, a
    transposing copy) or in another node (softmax's max and sum before its store) writes a
    fresh buffer: an element would be overwritten before its last read."""
    w = torch.randn(16, 16)
    body = {
        "flip": lambda y: y + y.flip(0),
        "softmax": lambda y: torch.softmax(y, -1),
        "transpose": lambda y: (y.t() * 2.0).contiguous(),
    }[case]

    def f(x):
        return body(torch.mm(x, w))

    sched = _check(f, torch.randn(16, 16))
    assert not _in_place(sched)


def test_interpreter_and_lint_see_the_in_place_source_die():
    torch.manual_seed(0)
    m, x = ConvBnSiLU().eval(), torch.randn(1, 8, 5, 5)
    _, sched = _schedule(m, x)
    (group, alloc), *_ = _in_place(sched)
    assert alloc.reuses in group.frees
    assert "in place" in str(alloc)
    # a plan that lends the buffer before its last read is refused
    alloc.in_place = False
    with pytest.raises(AssertionError, match="not free"):
        sched.lint()


def test_extern_result_lent_to_a_later_buffer():
    """A convolution's dead result is lent to a later kernel's buffer of the same layout (an
    extern's fresh result was never reused before)."""
    class ConvPoolGate(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            z = self.fc(torch.sigmoid(self.conv(x)).mean((2, 3)))  # the conv's last read
            return torch.tanh(x * z[:, :, None, None])  # a fresh buffer of the conv's layout

    torch.manual_seed(0)
    sched = _check(ConvPoolGate().eval(), torch.randn(2, 4, 6, 6))
    externs = {s.name for s in sched.steps if not isinstance(s, FusedGroup)}
    lent = [a for s in sched.steps for a in s.allocations if a.reuses in externs]
    assert lent, [str(a) for s in sched.steps for a in s.allocations]


def test_compile_fx_efficientnet_block_matches_eager():
    """A squeeze-excite block end to end (pool and gate read the epilogue's buffer)."""

    class SE(nn.Module):
        def __init__(self, c=16):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
            self.reduce, self.expand = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)
            self.proj = nn.Conv2d(c, c, 1)

        def forward(self, x):
            y = F.silu(self.dw(x))
            gate = torch.sigmoid(self.expand(F.silu(self.reduce(y.mean((2, 3), keepdim=True)))))
            return self.proj(y * gate) + x

    torch.manual_seed(0)
    m = SE().eval()
    x = torch.randn(2, 16, 10, 12).to(memory_format=torch.channels_last)
    with torch.no_grad():
        (got,) = compile_fx(torch.fx.symbolic_trace(m), [x])(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
