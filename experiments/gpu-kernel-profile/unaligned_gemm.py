"""Is an unaligned GEMM output row (GPT-2's 50257-word LM head, bf16) worth padding when the
product is a graph output, which then needs a copy back to eager's contiguous strides?

    python experiments/gpu-kernel-profile/unaligned_gemm.py [--m 4096] [--k 768] [--n 50257]

Times, on the GPU, ``h @ W.t()`` written unpadded (cuBLAS with ldc = n), written padded
(ldc = n rounded up to 8) and read as a view, and padded then copied contiguous; prints ms and
the ratios. JSON to $OUT/unaligned_gemm.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch


def bench(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--k", type=int, default=768)
    p.add_argument("--n", type=int, default=50257)
    a = p.parse_args()
    dt = torch.bfloat16
    h = torch.randn(a.m, a.k, device="cuda", dtype=dt)
    w = torch.randn(a.n, a.k, device="cuda", dtype=dt)
    n_pad = -(-a.n // 8) * 8
    wp = torch.zeros(n_pad, a.k, device="cuda", dtype=dt)
    wp[: a.n] = w
    rows = {
        "unpadded": bench(lambda: h @ w.t()),
        "padded_view": bench(lambda: (h @ wp.t())[:, : a.n]),
        "padded_then_contiguous": bench(lambda: (h @ wp.t())[:, : a.n].contiguous()),
    }
    for k, v in rows.items():
        print(f"{k:24s} {v:.4f} ms  ({v / rows['unpadded']:.2f} of unpadded)")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "unaligned_gemm.json").write_text(json.dumps(
            {"shape": vars(a), "ms": rows, "gpu": torch.cuda.get_device_name()}, indent=1))


if __name__ == "__main__":
    main()
