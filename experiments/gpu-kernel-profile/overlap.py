"""Why a compiled model's back-to-back calls take longer than its GPU time.

    python experiments/gpu-kernel-profile/overlap.py --models gpt2,efficientnet_b0 [--out DIR]

For each model of ``benchmarks/gpu_models.py`` (bf16 inference, the suite's shapes) and each
compiler, in one process per (model, compiler) unless ``--after-tc`` (kiln timed after
torch.compile has compiled the same model in the same process, as the suite does):

- back-to-back: median ms per call of calls queued without synchronizing (the suite's number);
- synchronized: median ms per call with a synchronize after each call;
- host: ms for a call to return while the GPU is idle (what the CPU spends enqueuing);
- GPU: kernel time per call from ``torch.profiler``;
- the CUDA runtime calls per call (``cudaStreamSynchronize``, ``cudaMemcpyAsync``,
  ``cudaMalloc``, ``cudaFree``, ``cudaEventSynchronize``...) with their host time: a call that
  waits for the GPU shows here, and explains back-to-back > max(host, GPU);
- the output's strides against eager's.

Results: JSON to ``--out`` (default ``$OUT`` or ``results/`` beside this script).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def log(msg: str) -> None:
    print(f"[overlap {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _compile(label: str, model):
    if label == "eager":
        return model
    if label == "torch.compile":
        import torch

        return torch.compile(model)
    import kiln

    return kiln.compile(model)


def _first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    for o in out:
        t = _first_tensor(o) if not isinstance(o, torch.Tensor) else o
        if t is not None:
            return t
    return None


def probes() -> dict:
    """How fast this process is at plain work: a Python loop, and 200 tiny GPU ops (host time
    to enqueue them): a process made slower by what ran before shows here."""
    import torch

    t = time.perf_counter()
    acc = 0
    for i in range(200_000):
        acc += i
    py_ms = (time.perf_counter() - t) * 1e3
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        x = x + 1
    launch_us = (time.perf_counter() - t) / 200 * 1e6
    torch.cuda.synchronize()
    import threading

    return {"python_loop_ms": round(py_ms, 2), "tiny_op_us": round(launch_us, 2),
            "threads": threading.active_count(), "children": len(os.listdir(f"/proc/{os.getpid()}/task")),
            "gc_counts": list(__import__("gc").get_count()),
            "gc_objects": len(__import__("gc").get_objects())}


def host_profile(fn, inputs, calls: int = 10) -> str:
    import cProfile
    import io
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*inputs)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()[text.getvalue().find("   ncalls"):]


def measure(model_name: str, label: str, after_tc: bool) -> dict:
    import gpu_models
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, make_inputs = gpu_models.BY_NAME[model_name].build(False)
    model = model.eval().to("cuda", torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in make_inputs("cuda"))
    r: dict = {"probes_start": probes()}
    with torch.no_grad():
        ref = _first_tensor(model(*inputs))
        r["eager_out_strides"] = list(ref.stride())
        if after_tc:
            tc = torch.compile(model)
            for _ in range(3):
                tc(*inputs)
            torch.cuda.synchronize()
            tc = None
            r["probes_after_tc"] = probes()
        fn = _compile(label, model)
        for _ in range(5):
            out = fn(*inputs)
        torch.cuda.synchronize()
        r["out_strides"] = list(_first_tensor(out).stride())
        out = None

        def b2b(n=20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn(*inputs)
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n * 1e3

        r["back_to_back_ms"] = statistics.median(b2b() for _ in range(7))
        syncs, hosts = [], []
        for _ in range(30):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(*inputs)
            hosts.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
            syncs.append((time.perf_counter() - t) * 1e3)
        r["synchronized_ms"] = statistics.median(syncs)
        r["host_ms"] = statistics.median(hosts)
        r["probes_end"] = probes()
        if os.environ.get("OVERLAP_HOST_PROFILE"):
            r["host_profile"] = host_profile(fn, inputs)
        calls = 5
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
        gpu = 0.0
        api: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                gpu += evt.time_range.elapsed_us()
            elif evt.name.startswith("cu"):
                api[evt.name][0] += 1
                api[evt.name][1] += evt.time_range.elapsed_us()
        r["gpu_ms"] = gpu / calls / 1e3
        r["runtime_calls_per_call"] = {k: [round(v[0] / calls, 1), round(v[1] / calls / 1e3, 4)]
                                       for k, v in sorted(api.items(), key=lambda kv: -kv[1][1])}
        if label == "kiln":
            import dataclasses

            import kiln
            from kiln_runtime.counters import counters as runtime_counters

            r["stats"] = {k: v for k, v in dataclasses.asdict(kiln.stats()).items()
                          if isinstance(v, (int, float))}
            r["runtime_counters"] = {k: v for k, v in dict(runtime_counters).items()
                                     if isinstance(v, (int, float))}
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,efficientnet_b0")
    p.add_argument("--compilers", default="eager,torch.compile,kiln")
    p.add_argument("--after-tc", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("MODEL", "COMPILER"))
    p.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(measure(*a.child, a.after_tc)), flush=True)
        return 0
    results: dict = {}
    for model in a.models.split(","):
        for label in a.compilers.split(","):
            variants = [False, True] if (label == "kiln" and a.after_tc) else [False]
            for after in variants:
                key = f"{model}/{label}" + ("/after_tc" if after else "")
                log(key)
                cmd = [sys.executable, __file__, "--child", model, label] + (["--after-tc"] if after else [])
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if not line:
                    results[key] = {"error": proc.stderr[-1500:]}
                    log(f"  failed: {proc.stderr[-600:]}")
                    continue
                r = results[key] = json.loads(line[-1][7:])
                log(f"  back-to-back {r['back_to_back_ms']:.3f} ms, synchronized {r['synchronized_ms']:.3f}, "
                    f"host {r['host_ms']:.3f}, GPU {r['gpu_ms']:.3f}; strides {r['out_strides']} "
                    f"(eager {r['eager_out_strides']})")
                for k in ("probes_start", "probes_after_tc", "probes_end"):
                    if k in r:
                        print(f"      {k}: {r[k]}", flush=True)
                if "host_profile" in r:
                    print(r["host_profile"], flush=True)
                for k, (n, ms) in list(r["runtime_calls_per_call"].items())[:8]:
                    print(f"      {k:40s} x{n:<6} {ms:.4f} ms", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overlap.json").write_text(json.dumps(results, indent=1))
    log(f"wrote {out / 'overlap.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
