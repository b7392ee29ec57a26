"""Regional compilation: cold compile of an N-layer transformer with
``kiln.compile_repeated_blocks`` (one region for every layer) against a 2-layer one, and steady
step time against whole-model ``kiln.compile``.

    python benchmarks/regional.py                    # 24 vs 2 layers, CPU
    python benchmarks/regional.py --layers 12 --d 128

Each measurement runs in a fresh process with an empty ``KILN_CACHE_DIR`` (cold). Compile time
= the first call's time minus a steady call's. Prints the ratios: cold(N layers, regional) /
cold(2 layers, regional) (target: about 1) and steady(regional) / steady(whole model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time, torch, kiln
layers, d, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True), layers,
    enable_nested_tensor=False).eval()
x = torch.randn(4, 64, d)
if mode == "regional":
    kiln.compile_repeated_blocks(model)
    run = model
else:
    run = kiln.compile(model)
with torch.no_grad():
    t0 = time.perf_counter(); run(x); first = time.perf_counter() - t0
    for _ in range(3): run(x)
    steps = []
    for _ in range(20):
        t0 = time.perf_counter(); run(x); steps.append(time.perf_counter() - t0)
steady = sorted(steps)[len(steps) // 2]
print(json.dumps({"compile_s": first - steady, "steady_ms": steady * 1e3}))
"""


def measure(layers: int, d: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, KILN_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(d), mode],
                             env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d", type=int, default=64)
    args = p.parse_args()
    t0 = time.perf_counter()
    results = {
        "regional_2": measure(2, args.d, "regional"),
        f"regional_{args.layers}": measure(args.layers, args.d, "regional"),
        f"whole_{args.layers}": measure(args.layers, args.d, "whole"),
    }
    big, small = results[f"regional_{args.layers}"], results["regional_2"]
    whole = results[f"whole_{args.layers}"]
    results["cold_ratio_regional_N_over_2"] = big["compile_s"] / small["compile_s"]
    results["cold_ratio_whole_N_over_regional_N"] = whole["compile_s"] / big["compile_s"]
    results["steady_ratio_regional_over_whole"] = big["steady_ms"] / whole["steady_ms"]
    results["wall_s"] = time.perf_counter() - t0
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
