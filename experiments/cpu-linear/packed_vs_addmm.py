"""Per-shape A/B of the CPU GEMMs for a constant weight: MKL's packed sgemm
(torch.ops.mkl._mkl_linear), oneDNN's packed linear (torch.ops.mkldnn._linear_pointwise on
mkldnn._reorder_linear_weight) and aten.addmm(out=) (inductor's extern), on the linear and
1x1-convolution shapes of benchmarks/cpu.py's models, fp32, in interleaved rounds (min and
median of each).

    python experiments/cpu-linear/packed_vs_addmm.py --threads 1 --clock thread  # robust to load

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
    ("whisper qkv,out (2x256)", 512, 256, 256), ("whisper ffn1", 512, 256, 1024),
    ("whisper ffn2", 512, 1024, 256), ("bert/t5 enc qkv,out (2x128)", 256, 256, 256),
    ("bert ffn1", 256, 256, 1024), ("bert ffn2", 256, 1024, 256),
    ("t5/bart dec qkv (2x64)", 128, 256, 256), ("t5/bart dec ffn1", 128, 256, 1024),
    ("t5/bart dec ffn2", 128, 1024, 256), ("bert fused qkv", 256, 256, 768),
    ("llama mlp up", 256, 256, 688), ("llama mlp down", 256, 688, 256),
    ("vit_small qkv", 394, 384, 1152), ("vit_small proj", 394, 384, 384),
    ("vit_small fc1", 394, 384, 1536), ("vit_small fc2", 394, 1536, 384),
    ("deit_tiny qkv", 394, 192, 576), ("deit_tiny fc1", 394, 192, 768),
    ("deit_tiny fc2", 394, 768, 192),
    ("swin s1 qkv", 6272, 96, 288), ("swin s1 fc1", 6272, 96, 384), ("swin s1 fc2", 6272, 384, 96),
    ("swin s2 qkv", 1568, 192, 576), ("swin s2 fc2", 1568, 768, 192), ("swin s3 qkv", 392, 384, 1152),
    ("swin s3 fc1", 392, 384, 1536), ("swin s4 fc2", 98, 3072, 768), ("gpt2 lm head", 256, 256, 8000),
    ("mobilenet SE/1x1", 2, 960, 1280),
]


#: 1x1 convolutions as GEMMs (N*H*W rows) in the convnets, batch 2
CONV_SHAPES = [
    ("effnet/mbv3 1x1 56x56", 6272, 24, 144), ("effnet 1x1 56x56 proj", 6272, 144, 24),
    ("effnet 1x1 28x28", 1568, 240, 40), ("effnet 1x1 14x14", 392, 480, 80),
    ("effnet 1x1 7x7", 98, 1152, 320), ("resnet50 1x1 56x56", 6272, 64, 256),
    ("resnet50 1x1 14x14", 392, 1024, 256), ("convnext_atto mlp s1", 6272, 40, 160),
]


def variants(m, k, n, bias: bool):
    """name -> a call computing x @ W.t() (+ b) for one shape (checked equal first)."""
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n) if bias else None
    mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
    dnn = torch.ops.mkldnn._reorder_linear_weight(w, m)
    out = torch.empty(m, n)
    fns = {"addmm": (lambda: torch.addmm(b, x, w.t(), out=out)) if bias else (lambda: torch.mm(x, w.t(), out=out)),
           "mkl": lambda: torch.ops.mkl._mkl_linear(x, mkl, w, b, m),
           "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, b, "none", [], "")}
    ref = x @ w.t() + (b if bias else 0)
    for f in fns.values():
        torch.testing.assert_close(f(), ref, rtol=1e-3, atol=1e-3)
    return fns


def bench(fns: dict, rounds: int, clock, target_s: float = 0.02) -> dict:
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
            t0 = clock()
            for _ in range(calls[name]):
                fn()
            samples[name].append((clock() - t0) / calls[name])
    return {n: (min(v), statistics.median(v)) for n, v in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="thread: time.thread_time (1 thread only: robust to load)")
    p.add_argument("--no-bias", action="store_true", help="x @ W.t() (kiln's bias-in-epilogue case)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--only", default="", help="shapes whose name contains this")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.clock == "thread" else time.perf_counter
    shapes = SHAPES[:3] if a.smoke else SHAPES + CONV_SHAPES
    shapes = [s for s in shapes if a.only in s[0]]
    rounds = 3 if a.smoke else a.rounds
    print(f"{a.threads} threads, {a.clock} clock, {'no ' if a.no_bias else ''}bias; min us (median us)")
    print(f"{'shape':30} {'M':>5} {'K':>5} {'N':>5} {'addmm':>15} {'mkl':>15} {'onednn':>15} "
          f"{'mkl/addmm':>9} {'onednn/mkl':>10}")
    for what, m, k, n in shapes:
        r = bench(variants(m, k, n, not a.no_bias), rounds, clock)
        cell = lambda v: f"{v[0]*1e6:7.1f} ({v[1]*1e6:5.0f})"  # noqa: E731
        print(f"{what:30} {m:5} {k:5} {n:5} {cell(r['addmm']):>15} {cell(r['mkl']):>15} "
              f"{cell(r['onednn']):>15} {r['mkl'][0]/r['addmm'][0]:9.3f} {r['onednn'][0]/r['mkl'][0]:10.3f}",
              flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
