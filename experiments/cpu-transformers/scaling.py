"""Wall and process CPU time per call of kiln and inductor (and eager) on benchmarks/cpu.py
models at 1 and 2 threads, interleaved rounds in one process (min and median).

    python experiments/cpu-transformers/scaling.py distilbert,bert --rounds 15

cpu/wall over 1 at 2 threads = the second thread's share (work or spinning)."""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp())
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import cpu  # noqa: E402
import torch  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--only", default="eager,inductor,kiln")
    a = p.parse_args()
    for name in a.models.split(","):
        w = {m.name: m for m in cpu.MODELS}[name]
        torch.manual_seed(0)
        model, inputs = w.build(False)
        model.eval()
        fns = {}
        with torch.no_grad():
            ref = cpu.tensors_of(model(*inputs))
            for c in a.only.split(","):
                if c == "eager":
                    fns[c] = lambda model=model, inputs=inputs: model(*inputs)
                    continue
                f = cpu.make_compiled(c, model, inputs)
                torch.testing.assert_close(cpu.tensors_of(f(*inputs)), ref, rtol=1e-3, atol=1e-3)
                fns[c] = lambda f=f, inputs=inputs: f(*inputs)
            for th in map(int, a.threads.split(",")):
                torch.set_num_threads(th)
                for f in fns.values():
                    for _ in range(3):
                        f()
                wall = {c: [] for c in fns}
                cpu_t = {c: [] for c in fns}
                for _ in range(a.rounds):
                    for c, f in fns.items():
                        n = 5
                        t0, p0 = time.perf_counter(), time.process_time()
                        for _ in range(n):
                            f()
                        wall[c].append((time.perf_counter() - t0) / n)
                        cpu_t[c].append((time.process_time() - p0) / n)
                line = [f"{name:16} {th}t"]
                for c in fns:
                    line.append(f"{c}: min {min(wall[c])*1e3:7.2f} med {statistics.median(wall[c])*1e3:7.2f} "
                                f"cpu/wall {statistics.median(cpu_t[c]) / statistics.median(wall[c]):.2f}")
                print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
