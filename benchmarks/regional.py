"""Regional compilation: cold compile of an N-layer transformer with
``kiln.compile_repeated_blocks`` (one region for every layer) against a 2-layer one, and steady
step time against whole-model ``kiln.compile``.

    python benchmarks/regional.py                    # 24 vs 2 layers, CPU
    python benchmarks/regional.py --layers 12 --d 128
    python benchmarks/regional.py --device cuda      # on a GPU (CUDA-synchronized timing)
    python benchmarks/regional.py --smoke            # 4 vs 2 layers, few rounds: < 1 min

Each measurement runs in a fresh process with an empty ``KILN_CACHE_DIR`` (cold). Compile time
= the first call's time minus a steady call's. Prints the ratios: cold(N layers, regional) /
cold(2 layers, regional) (target: about 1) and steady(regional) / steady(whole model); and,
as the machine may be noisy, ``steady_in_turns``: the N-layer regional, whole-model and
eager models in one process, timed in turns call by call (``--rounds``), with the ratio of
their medians and the median of the per-round ratios (target: within 2%); ``--repeats K``
runs that K times in fresh processes and reports the medians of both ratios. The JSON is
printed, and written to ``$OUT/regional.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time, torch, kiln
layers, d, mode, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
torch.manual_seed(0)
if device == "cpu":
    torch.set_num_threads(1)
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True), layers,
    enable_nested_tensor=False).eval().to(device)
x = torch.randn(4, 64, d, device=device)
if mode == "regional":
    kiln.compile_repeated_blocks(model)
    run = model
else:
    run = kiln.compile(model)
with torch.no_grad():
    t0 = time.perf_counter(); run(x); sync(); first = time.perf_counter() - t0
    for _ in range(3): run(x)
    steps = []
    for _ in range(20):
        sync(); t0 = time.perf_counter(); run(x); sync(); steps.append(time.perf_counter() - t0)
steady = sorted(steps)[len(steps) // 2]
print(json.dumps({"compile_s": first - steady, "steady_ms": steady * 1e3}))
"""


STEADY = r"""
import json, statistics, sys, time, torch, kiln
layers, d, rounds, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
if device == "cpu":
    torch.set_num_threads(1)

def model():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True), layers,
        enable_nested_tensor=False).eval().to(device)

x = torch.randn(4, 64, d, device=device)
regional = kiln.compile_repeated_blocks(model())
whole = kiln.compile(model())
eager = model()
times = {"regional": [], "whole": [], "eager": []}
with torch.no_grad():
    want = eager(x)
    for run in (regional, whole):
        torch.testing.assert_close(run(x), want, atol=1e-4, rtol=1e-4)
    for _ in range(3):
        regional(x), whole(x)
    for i in range(rounds):  # in turns, sample by sample: a load spike hits all three alike
        order = [("regional", regional), ("whole", whole), ("eager", eager)]
        for name, run in order if i % 2 else order[::-1]:
            sync(); t0 = time.perf_counter(); run(x); sync()
            times[name].append(time.perf_counter() - t0)
out = {f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()}
out["ratio_of_medians"] = out["regional_ms"] / out["whole_ms"]
out["median_of_ratios"] = statistics.median(
    r / w for r, w in zip(times["regional"], times["whole"], strict=True))
print(json.dumps(out))
"""


def steady(layers: int, d: int, rounds: int, device: str) -> dict:
    """Steady times of regional, whole-model and eager in one process, in turns."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, KILN_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", STEADY, str(layers), str(d), str(rounds),
                              device],
                             env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(layers: int, d: int, mode: str, device: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, KILN_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(d), mode, device],
                             env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeats", type=int, default=1,
                   help="steady_in_turns this many times (fresh processes): the median ratio")
    p.add_argument("--smoke", action="store_true", help="4 vs 2 layers, d 32, 6 rounds")
    args = p.parse_args()
    if args.smoke:
        args.layers, args.d, args.rounds = 4, 32, 6
    t0 = time.perf_counter()
    results = {
        "regional_2": measure(2, args.d, "regional", args.device),
        f"regional_{args.layers}": measure(args.layers, args.d, "regional", args.device),
        f"whole_{args.layers}": measure(args.layers, args.d, "whole", args.device),
    }
    big, small = results[f"regional_{args.layers}"], results["regional_2"]
    whole = results[f"whole_{args.layers}"]
    results["cold_ratio_regional_N_over_2"] = big["compile_s"] / small["compile_s"]
    results["cold_ratio_whole_N_over_regional_N"] = whole["compile_s"] / big["compile_s"]
    results["steady_ratio_regional_over_whole"] = big["steady_ms"] / whole["steady_ms"]
    runs = [steady(args.layers, args.d, args.rounds, args.device) for _ in range(args.repeats)]
    results["steady_in_turns"] = runs[0] if len(runs) == 1 else {
        "runs": runs, **{key: statistics.median(r[key] for r in runs)
                         for key in ("median_of_ratios", "ratio_of_medians")}}
    results["meta"] = {"device": args.device, "layers": args.layers, "d": args.d,
                       "rounds": args.rounds, "repeats": args.repeats, "smoke": args.smoke,
                       "wall_s": time.perf_counter() - t0}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "regional.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
