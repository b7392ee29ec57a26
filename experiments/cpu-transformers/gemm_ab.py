"""A/B of kiln's packed GEMM for constant weights on benchmarks/cpu.py models, one process:
the model compiled with each choice of the CPU library's ``packed_gemms`` (loopir's
``lowerings/extern.py``), plus inductor, timed in interleaved rounds.

    python experiments/cpu-transformers/gemm_ab.py distilbert,vit_small --threads 1   # thread CPU time
    python experiments/cpu-transformers/gemm_ab.py bert --threads 2                   # wall (quiet machine)

At 1 thread the clock is ``time.thread_time`` (robust to other jobs on the machine); at 2
it is wall time (OpenMP threads wait for descheduled peers under load)."""
import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
os.environ["KILN_GRAPH_CACHE"] = "0"
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp())
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import cpu  # noqa: E402
import kiln_loopir.lowerings.extern as extern  # noqa: E402
import torch  # noqa: E402

CHOICES = {"onednn": ("onednn", "mkl"), "mkl": ("mkl",), "mm": ()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--choices", default="onednn,mkl")
    p.add_argument("--no-inductor", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    base = extern.DEVICE_LIBRARIES["cpu"]
    for name in a.models.split(","):
        w = {m.name: m for m in cpu.MODELS}[name]
        torch.manual_seed(0)
        model, inputs = w.build(False)
        model.eval()
        fns = {}
        with torch.no_grad():
            ref = cpu.tensors_of(model(*inputs))
            if not a.no_inductor:
                f = cpu.make_compiled("inductor", model, inputs)
                torch.testing.assert_close(cpu.tensors_of(f(*inputs)), ref, rtol=1e-3, atol=1e-3)
                fns["inductor"] = lambda f=f, inputs=inputs: f(*inputs)
            for c in a.choices.split(","):
                extern.DEVICE_LIBRARIES["cpu"] = dataclasses.replace(base, packed_gemms=CHOICES[c])
                try:
                    f = cpu.make_compiled("kiln", model, inputs)
                    torch.testing.assert_close(cpu.tensors_of(f(*inputs)), ref, rtol=1e-3, atol=1e-3)
                finally:
                    extern.DEVICE_LIBRARIES["cpu"] = base
                fns[f"kiln-{c}"] = lambda f=f, inputs=inputs: f(*inputs)
            for f in fns.values():
                for _ in range(3):
                    f()
            samples = {c: [] for c in fns}
            for _ in range(a.rounds):
                for c, f in fns.items():
                    t0 = clock()
                    for _ in range(3):
                        f()
                    samples[c].append((clock() - t0) / 3)
        first = next(iter(fns))
        line = [f"{name:16} {a.threads}t"]
        for c, v in samples.items():
            line.append(f"{c} {min(v)*1e3:7.2f} ({statistics.median(v)*1e3:7.2f}) "
                        f"{min(samples[first]) / min(v):.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
