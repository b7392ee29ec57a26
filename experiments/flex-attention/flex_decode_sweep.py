"""Tile sweep of kiln's FlexAttention decoding kernel on CUDA (kiln_codegen_triton/
flex_decoding.py): key tile, warps, pipeline stages and KV shares for one decoding shape,
each timed with triton.testing.do_bench and checked against the default config's output.

    python experiments/flex-attention/flex_decode_sweep.py   # B32 H16 q1 kv8192 D64 bf16, causal
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton
from kiln_codegen_triton import flex_decoding
from kiln_codegen_triton.flex_decoding import FlexDecodingKernel
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import create_block_mask


def main() -> None:
    p = argparse.ArgumentParser()
    for name, default in (("B", 32), ("H", 16), ("q", 1), ("kv", 8192), ("D", 64)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    S, Lq = a.kv, a.q

    def mask(b, h, m, n):
        return n <= S - Lq + m

    def score(s, b, h, m, n):
        return s

    bm = create_block_mask(mask, 1, 1, Lq, S, device="cuda", BLOCK_SIZE=128)
    q = torch.randn(a.B, a.H, Lq, a.D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(a.B, a.H, S, a.D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    t = bm.as_tuple()

    def f(q, k, v, *bm_tensors):
        return flex_hop(q, k, v, score, (*bm_tensors, mask), 0.125, {}, (), ())

    gm = make_fx(f)(q, k, v, *t[:-1])
    kernel = FlexDecodingKernel(gm.sdpa_score0, gm.sdpa_mask0, (), (), q.dtype, a.D, a.D)

    def run():
        return kernel(q, k, v, t[2], t[3], t[4], t[5], t[-3], t[-2], 0.125, (), ())

    want = run()[0]
    rows = []
    default = flex_decoding.decode_tiles
    for block_n, warps, stages, splits in itertools.product((64, 128), (2, 4, 8), (2, 3, 4),
                                                            (1, 2, 4)):
        flex_decoding.decode_tiles = lambda dtype, d, c=(block_n, warps, stages): c
        kernel.splits = splits
        try:
            out = run()[0]
            ok = torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2)
            ms = triton.testing.do_bench(run, warmup=10, rep=50)
        except Exception as e:  # noqa: BLE001  (a config that does not fit: recorded)
            ok, ms = False, f"{type(e).__name__}"
        rows.append({"block_n": block_n, "warps": warps, "stages": stages, "splits": splits,
                     "ms": ms, "ok": ok})
        print(rows[-1], flush=True)
    flex_decoding.decode_tiles = default
    good = sorted((r for r in rows if r["ok"]), key=lambda r: r["ms"])
    print("best", good[:5])
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "flex_decode_sweep.json"), "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
