"""Where GPU time goes, kernel by kernel: kiln against torch.compile on the same workload.

    python experiments/gpu-kernel-profile/gpu_profile.py [--cases resnet18_b1,bert_small_b1,...] [--out DIR]

For each case, both compilers (default mode) are warmed up, then five calls run under
``torch.profiler``; the table lists each compiler's CUDA kernels by time per call (with how
many launches per call), the GPU time per call, and the synchronized wall time per call. The
gap between GPU time and wall time is launch overhead (what CUDA graphs remove); a kernel
that is slower than the other compiler's counterpart shows in the top rows. Results go as
JSON to ``--out`` (default ``$OUT`` or ``results/`` beside this script).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is experiments/<topic>/)
sys.path.insert(0, str(ROOT / "benchmarks"))


def log(msg: str) -> None:
    print(f"[gpu_profile {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _inference(name: str):
    import gpu_runtime

    model, inputs = gpu_runtime.build(name)
    return model, inputs, None


def _timm_fp16(name: str):
    """benchmarks/gpu.py's timm rows: fp16 inference, batch 32 at 224x224."""
    import torch

    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()
    import timm

    model = timm.create_model(name, pretrained=False).eval().cuda().half()
    return model, (torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.half),), None


def _gpt2_fp16_b8():
    """benchmarks/gpu.py's GPT-2 row: fp16 inference, batch 8, seq 512."""
    import torch
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config()).eval().cuda().half()
    return model, (torch.randint(0, 50000, (8, 512), device="cuda"),), None


def _bert_train_fp16():
    import train

    work = train.workloads("cuda")[0]
    return work.make_model(), work.make_batch(), work.loss


def _suite_model(name: str):
    """A model of benchmarks/gpu_models.py as its suite runs it: bf16 inference, the suite's
    batch and shapes (case ``suite:<name>``)."""
    import gpu_models
    import torch

    model, make_inputs = gpu_models.BY_NAME[name].build(False)
    model = model.eval().to("cuda", torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in make_inputs("cuda"))
    return model, inputs, None


CASES = {
    "resnet18_b1": lambda: _inference("resnet18"),
    "bert_small_b1": lambda: _inference("bert_small"),
    "gpt2_small_b1": lambda: _inference("gpt2_small"),
    "vit_base_fp16_b32": lambda: _timm_fp16("vit_base_patch16_224"),
    "resnet50_fp16_b32": lambda: _timm_fp16("resnet50"),
    "gpt2_fp16_b8": _gpt2_fp16_b8,
    "bert_base_train_fp16": _bert_train_fp16,
}


def _step(fn, inputs, loss, params):
    import torch

    if loss is None:
        def run():
            with torch.no_grad():
                return fn(*inputs)
        return run

    def run():
        for p in params:
            p.grad = None
        out = loss(fn(*inputs))
        out.backward()
        return out
    return run


def profile_one(case: str, compiler: str, calls: int = 5, host_profile: bool = False) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, inputs, loss = _suite_model(case[6:]) if case.startswith("suite:") else CASES[case]()
    if loss is None:
        model = model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    import train

    run = _step(train._compiled(model, compiler), inputs, loss, params)  # (fresh frontend and stats)
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    walls = []
    for _ in range(20):
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    host = None
    if host_profile:  # --host: where the host time of a steady call goes (cProfile, own time)
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            run()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        host = text.getvalue()[text.getvalue().find("   ncalls"):]
        print(f"--- host time of 10 calls, {case} {compiler}\n{host}", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    per_kernel: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        entry = per_kernel[evt.name]
        entry[0] += evt.time_range.elapsed_us() / calls / 1e3
        entry[1] += 1 / calls
    rows = sorted(([k, round(v[0], 4), round(v[1], 1)] for k, v in per_kernel.items()),
                  key=lambda r: -r[1])
    gpu_ms = sum(r[1] for r in rows)
    return {"first_call_s": round(first, 2), "wall_ms": round(statistics.median(walls), 4),
            "gpu_ms": round(gpu_ms, 4), "launches": round(sum(r[2] for r in rows), 1),
            "kernels": rows, **({"host_profile": host} if host else {})}



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--host", action="store_true",
                        help="also print a cProfile of 10 steady calls (where host time goes)")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    results = {}
    for case in args.cases.split(","):
        results[case] = {}
        for compiler in ("kiln", "inductor"):
            log(f"{case} / {compiler}")
            try:
                r = profile_one(case, compiler, host_profile=args.host)
            except Exception as e:  # one failing case must not hide the others
                log(f"  failed: {type(e).__name__}: {e}")
                results[case][compiler] = {"error": f"{type(e).__name__}: {e}"}
                continue
            results[case][compiler] = r
            log(f"  first call {r['first_call_s']} s, wall {r['wall_ms']} ms, GPU {r['gpu_ms']} ms, "
                f"{r['launches']} launches/call")
            for name, ms, n in r["kernels"][: args.top]:
                print(f"    {ms:9.4f} ms  x{n:<5} {name[:110]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_profile.json").write_text(json.dumps(results, indent=1))
    log(f"wrote {out / 'gpu_profile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
