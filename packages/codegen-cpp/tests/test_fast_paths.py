"""The code paths that make kernels fast, end to end: vectorized math, values computed once per
row and kept in thread-local rows, fused layernorms seen through reshapes, channels-last
convolutions. Every result is checked against eager (and the loopir interpreter, in ``run``)."""

from __future__ import annotations

import pytest
import torch
from kiln_codegen_cpp.compiler import vectorized_loops
from kiln_codegen_cpp.kernel import ROW_LIMIT
from test_pipeline import kernels, run


def test_sin_and_cos_of_one_value_vectorize():
    """GCC merges sinf(x) and cosf(x) into a sincos call that has no vector version, which
    kept the whole loop scalar; kernels call them through non-builtin aliases."""
    c = run(lambda x: torch.sin(x) * 2.0 + torch.cos(x), torch.randn(64, 256))
    (k,) = kernels(c)
    assert "kiln_sinf(" in k.meta["body"] and "kiln_cosf(" in k.meta["body"]
    assert vectorized_loops(k.source), k.meta["body"]


def _count(body: str, text: str) -> int:
    return sum(ln.count(text) for ln in body.splitlines())


def test_softmax_computes_exp_once_per_element():
    c = run(lambda x: torch.softmax(x, -1), torch.randn(64, 1000))
    (k,) = kernels(c)
    body = k.meta["body"]
    # the sum loop (vector chunks + scalar tail) computes exp and keeps it in a row; the
    # output loop reads the row
    assert _count(body, "expf(") == 2, body
    assert "float saved0[1000];" in body and "= saved0[r0];" in body
    assert vectorized_loops(k.source)


def test_softmax_rows_longer_than_the_limit_recompute():
    n = ROW_LIMIT + 16
    c = run(lambda x: torch.softmax(x, -1), torch.randn(3, n))
    (k,) = kernels(c)
    assert "saved" not in k.meta["body"]
    assert _count(k.meta["body"], "expf(") == 3


def test_softmax_dynamic_rows_recompute():
    c = run(lambda x: torch.softmax(x, -1), torch.randn(5, 40), dynamic=True)
    (k,) = kernels(c)
    assert "saved" not in k.meta["body"]
    torch.testing.assert_close(c(torch.randn(7, 33))[0].sum(-1), torch.ones(7))


def test_log_softmax_and_sigmoid_weighted_sum_share_rows():
    def f(x):
        e = torch.sigmoid(x)
        return e / e.sum(-1, keepdim=True), torch.log_softmax(x, -1)

    c = run(f, torch.randn(32, 96), atol=1e-5, rtol=1e-5)
    body = "\n".join(k.meta["body"] for k in kernels(c))
    assert "saved" in body


class _Embeddings(torch.nn.Module):
    """BERT's embeddings: three lookups summed (an internal buffer: only the layernorm reads
    it), then a layernorm."""

    def __init__(self, d=64):
        super().__init__()
        self.word, self.pos, self.kind = (torch.nn.Embedding(n, d) for n in (50, 12, 2))
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, ids, kinds):
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        return self.norm(self.word(ids) + self.pos(pos) + self.kind(kinds))


def test_internal_rows_are_thread_local_not_allocated():
    m = _Embeddings().eval()
    with torch.no_grad():
        c = run(m, torch.randint(0, 50, (4, 12)), torch.randint(0, 2, (4, 12)), atol=1e-5, rtol=1e-5)
    (k,) = kernels(c)
    (g,) = c.module.meta["schedule"].groups
    (internal,) = [n.buffer.name for n in g.nodes if n.kind == "pointwise" and n.inner
                   and n.buffer.name in g.internal_buffers]
    assert "float row0[64];" in k.meta["body"]
    assert internal not in c.module.wrapper_source  # never allocated, never passed


class _PreNormLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.lin = torch.nn.LayerNorm(32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.lin(self.ln(x))


def test_layernorm_feeding_a_matmul_is_one_kernel():
    """Pre-norm: the statistics over [B, T] and the normalized rows seen as [B*T, D] for the
    matmul are one kernel (the scheduler fuses through the reshape)."""
    with torch.no_grad():
        c = run(_PreNormLinear().eval(), torch.randn(2, 8, 32), atol=1e-5, rtol=1e-5)
    assert len(kernels(c)) == 1


class _BasicBlock(torch.nn.Module):
    """resnet's basic block: conv-bn-relu-conv-bn + identity, relu."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


@pytest.mark.parametrize("threads", [1, 2])
def test_convolutions_run_channels_last(threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)  # torch's conv picks its backend by thread count too
    try:
        blocks = torch.nn.Sequential(_BasicBlock(16), _BasicBlock(16)).eval()
        with torch.no_grad():
            c = run(blocks, torch.randn(2, 16, 10, 10), atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(old)
    sched = c.module.meta["schedule"]
    convs = [s for s in sched.externs if "convolution" in str(s.kernel.op)]
    assert len(convs) == 4
    for s in convs:
        n, ch, h, w = s.kernel.layout.size
        assert list(s.kernel.layout.stride) == [ch * h * w, 1, w * ch, ch]  # NHWC
        x, weight = s.kernel.inputs[:2]
        assert weight.value.is_contiguous(memory_format=torch.channels_last)
    # the graph output keeps eager's layout
    assert c(torch.randn(2, 16, 10, 10))[0].is_contiguous()


class _ConvOutputs(torch.nn.Module):
    """Outputs next to channels-last convolutions: an input of a conv, a conv's result, and a
    grouped conv's result."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)

    def forward(self, x):
        y = torch.relu(x * 2 + 1)
        z = self.c1(y)
        return y, z, self.c2(torch.relu(z))


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_keep_eager_strides_next_to_channels_last_convs(dynamic):
    m = _ConvOutputs().eval()
    with torch.no_grad():
        c = run(m, torch.randn(2, 8, 9, 9), dynamic=dynamic, atol=1e-4, rtol=1e-4)
        x = torch.randn(3, 8, 12, 12) if dynamic else torch.randn(2, 8, 9, 9)
        for got, want in zip(c(x), m(x), strict=True):
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    convs = [s for s in c.module.meta["schedule"].externs if "convolution" in str(s.kernel.op)]
    assert all(s.kernel.layout.stride[1] == 1 for s in convs)  # they still run channels-last
