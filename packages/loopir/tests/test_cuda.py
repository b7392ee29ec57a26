"""The interpreter runs on CUDA tensors too (needs a GPU: marker ``cuda``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _cases():
    d = "cuda"
    x = torch.randn(8, 33, device=d)
    h = torch.randn(8, 33, device=d, dtype=torch.float16)
    i = torch.randint(-5, 5, (8, 33), device=d)
    idx = torch.tensor([0, 3, 7], device=d)
    w, b = torch.randn(33, device=d), torch.randn(33, device=d)
    return [
        (lambda x, y: x.cos() + y.sin(), (x, x.t().contiguous().t())),
        (lambda x: (torch.softmax(x, -1), x.var(0), x.argmax(1)), (x,)),
        (lambda h: (h.float().sum(1), (h * 2).sigmoid(), h.amax(0)), (h,)),
        (lambda i: (i // 3, i % 3, i.sum(0), (i > 0).any(1)), (i,)),
        (lambda x, w, b: F.gelu(F.layer_norm(x, (33,), w, b)), (x, w, b)),
        (lambda x, idx: (x[idx], x.index_put((idx,), x[:1] * 0 + 1.0, accumulate=True),
                         torch.cat([x, x * 2], 1)), (x, idx)),
        (lambda x: torch.relu(x @ x.t() + 1), (x,)),
    ]


@pytest.mark.parametrize("case", range(7))
def test_interpreter_on_cuda(case):
    from helpers import check

    fn, args = _cases()[case]
    sched, graph = check(fn, *args, atol=2e-3, rtol=2e-3)
    assert graph.device.type == "cuda"


if __name__ == "__main__":  # runnable without pytest on a GPU machine
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    for k in range(7):
        test_interpreter_on_cuda(k)
        print("case", k, "ok")
