"""FlexAttention on the CPU: kiln.compile (dense decomposition, C++ codegen) against eager
``flex_attention`` (torch's math path) for the forward, and against torch's flex_attention
operator run eagerly with its autograd rule for forward+backward (eager ``flex_attention``
refuses inputs that need grad on the CPU). Causal BlockMask + ALiBi score_mod.

    python experiments/flex-attention/flex_attention_cpu.py [--B 2 --H 4 --L 512 --D 64]
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import kiln
import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

warnings.filterwarnings("ignore")


def timed(fn, reps):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main():
    p = argparse.ArgumentParser()
    for name, default in (("B", 2), ("H", 4), ("L", 512), ("D", 64), ("reps", 5)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(a.H)])

    def alibi(s, b, h, m, n):
        return s + slopes[h] * (n - m)

    def alibi_buf(s, b, h, m, n, sl):
        return s + sl[h] * (n - m)

    def causal(b, h, m, n):
        return m >= n

    bm = create_block_mask(causal, a.B, a.H, a.L, a.L, device="cpu", BLOCK_SIZE=128)

    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask)

    q, k, v = (torch.randn(a.B, a.H, a.L, a.D) for _ in range(3))
    compiled = kiln.compile(f, fullgraph=True)
    t0 = time.perf_counter()
    compiled(q, k, v, bm)
    cold_fwd = time.perf_counter() - t0
    res = {"shape": [a.B, a.H, a.L, a.D], "threads": torch.get_num_threads()}
    res["fwd_eager_flex_ms"] = timed(lambda: f(q, k, v, bm), a.reps)
    res["fwd_kiln_ms"] = timed(lambda: compiled(q, k, v, bm), a.reps)
    torch.testing.assert_close(compiled(q, k, v, bm), f(q, k, v, bm))

    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def kiln_step():
        torch.autograd.grad(compiled(qg, kg, vg, bm).sum(), (qg, kg, vg))

    def hop_step():
        out = flex_hop(qg, kg, vg, alibi_buf, bm.as_tuple(), 1 / math.sqrt(a.D), {}, (slopes,))[0]
        torch.autograd.grad(out.sum(), (qg, kg, vg))

    t0 = time.perf_counter()
    kiln_step()
    cold_train = time.perf_counter() - t0
    res["fwd_bwd_torch_op_eager_ms"] = timed(hop_step, a.reps)
    res["fwd_bwd_kiln_ms"] = timed(kiln_step, a.reps)
    res["cold_compile_fwd_s"] = round(cold_fwd, 2)
    res["cold_compile_fwd_bwd_s"] = round(cold_train, 2)
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()}))


if __name__ == "__main__":
    main()
