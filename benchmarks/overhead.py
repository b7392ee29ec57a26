"""Per-call overhead of a compiled tiny function: guards + dispatch, not kernels.

Runs one tiny function three ways in one process — eager, `kiln_frontend.optimize("eager")` and
`torch.compile(backend="eager")` — and prints each one's time per call and the overhead over
eager as a ratio of kiln's to torch.compile's. Target: kiln's overhead at most torch.compile's.

    python benchmarks/overhead.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit

import kiln_frontend
import torch


def tiny(x, y):
    return x + y


def time_per_call(fn, args, calls: int, repeats: int) -> float:
    for _ in range(50):
        fn(*args)  # warm-up: compile and fill caches
    samples = timeit.repeat(lambda: fn(*args), number=calls, repeat=repeats)
    return statistics.median(samples) / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    inputs = (torch.randn(4), torch.randn(4))
    variants = {
        "eager": tiny,
        "kiln (eager backend)": kiln_frontend.optimize("eager")(tiny),
        "torch.compile (eager backend)": torch.compile(tiny, backend="eager"),
    }
    for name, fn in variants.items():
        torch.testing.assert_close(fn(*inputs), tiny(*inputs), msg=f"{name} is wrong")

    times = {}
    for i, (name, fn) in enumerate(variants.items(), 1):
        print(f"[{i}/{len(variants)}] timing {name} ...", file=sys.stderr, flush=True)
        times[name] = time_per_call(fn, inputs, args.calls, args.repeats)

    eager = times["eager"]
    print(f"\n{'variant':32} {'us/call':>10} {'overhead us':>12}")
    for name, t in times.items():
        print(f"{name:32} {t * 1e6:10.2f} {(t - eager) * 1e6:12.2f}")
    kiln_over = times["kiln (eager backend)"] - eager
    torch_over = times["torch.compile (eager backend)"] - eager
    ratio = kiln_over / torch_over if torch_over > 0 else float("inf")
    print(f"\nkiln overhead / torch.compile overhead = {ratio:.2f}x  (target <= 1.00x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
