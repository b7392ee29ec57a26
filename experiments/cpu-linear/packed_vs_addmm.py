"""Per-shape A/B of MKL's packed sgemm (torch.ops.mkl._mkl_linear, what kiln's packed_linear
emits) against aten.addmm(out=) (inductor's extern) on the linear shapes of
benchmarks/cpu.py's models, fp32, in interleaved rounds (min and median of each).

    python experiments/cpu-linear/packed_vs_addmm.py --threads 2        # all shapes
    python experiments/cpu-linear/packed_vs_addmm.py --smoke            # 3 shapes, few rounds

Run it on a quiet machine: a ratio under 1 means the packed GEMM is faster."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

#: (model, M rows = batch x tokens, K in, N out)
SHAPES = [
    ("bert/whisper/t5/bart qkv,out", 512, 256, 256), ("bert ffn1", 512, 256, 1024),
    ("bert ffn2", 512, 1024, 256), ("llama mlp up", 256, 256, 688), ("llama mlp down", 256, 688, 256),
    ("llama qkv", 256, 256, 256), ("vit_small qkv", 394, 384, 1152), ("vit_small fc1", 394, 384, 1536),
    ("vit_small fc2", 394, 1536, 384), ("deit_tiny qkv", 394, 192, 576), ("deit_tiny fc1", 394, 192, 768),
    ("swin s1 qkv", 6272, 96, 288), ("swin s1 fc1", 6272, 96, 384), ("swin s1 fc2", 6272, 384, 96),
    ("swin s2 qkv", 1568, 192, 576), ("swin s2 fc2", 1568, 768, 192), ("swin s3 qkv", 392, 384, 1152),
    ("swin s3 fc1", 392, 384, 1536), ("swin s4 fc2", 98, 3072, 768), ("gpt2 lm head", 256, 256, 8000),
    ("mobilenet SE/1x1", 2, 960, 1280),
]


def bench(fns: dict, rounds: int, target_s: float = 0.02) -> dict:
    calls = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        fn()
        calls[name] = max(1, int(target_s / max(time.perf_counter() - t0, 1e-7)))
    samples = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls[name])
    return {n: (min(v), statistics.median(v)) for n, v in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    shapes = SHAPES[:3] if a.smoke else SHAPES
    rounds = 3 if a.smoke else a.rounds
    print(f"{'shape':30} {'M':>5} {'K':>5} {'N':>5} {'addmm us':>9} {'packed us':>9} {'packed/addmm':>12}  (min; median ratio)")
    for what, m, k, n in shapes:
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        out = torch.empty(m, n)
        torch.testing.assert_close(torch.ops.mkl._mkl_linear(x, packed, w, b, m), torch.addmm(b, x, w.t()),
                                   rtol=1e-4, atol=1e-4)
        r = bench({"addmm": lambda x=x, w=w, b=b, out=out: torch.addmm(b, x, w.t(), out=out),
                   "packed": lambda x=x, w=w, b=b, p=packed, m=m: torch.ops.mkl._mkl_linear(x, p, w, b, m)},
                  rounds)
        print(f"{what:30} {m:5} {k:5} {n:5} {r['addmm'][0]*1e6:9.1f} {r['packed'][0]*1e6:9.1f} "
              f"{r['packed'][0]/r['addmm'][0]:12.3f}  ({r['packed'][1]/r['addmm'][1]:.3f})")


if __name__ == "__main__":
    with torch.no_grad():
        main()
