"""Where a cold compile's wall time goes: kiln's first call on a model, under cProfile.

    bash scripts/device_tests.sh cold_profile --models vit_base_patch16_224       # on the H200
    python experiments/cold-compile-profile/cold_profile.py --device cpu --models resnet50

Per model, in one process with empty caches (like ``benchmarks/gpu.py``'s models section):
eager runs first (CUDA, cuBLAS and cuDNN start outside the timing); with ``--warm-up`` (the
default) a small model is compiled first, so compile workers are already up, as they are
for every model after the first in gpu.py. Then ``kiln.compile(model)`` and its first call
run under cProfile. Prints the wall time, kiln's compile phases (``kiln_runtime.compile_timer``)
and what they leave out, then the functions with the most cumulative and own time. fp16 on
CUDA, float32 on CPU. Benchmarks only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is experiments/<topic>/)
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu  # noqa: E402  (the models, the tree set-up and the cache folders of benchmarks/gpu.py)


def profile_model(b, name: str, build, top: int) -> None:
    import kiln
    import kiln_frontend
    from kiln_runtime import compile_timer

    torch = b.torch
    model, inputs = build()
    model = model.eval().to(b.device)
    if b.device == "cuda":
        model = model.half()
    inputs = tuple(t.to(b.device).half() if t.is_floating_point() and b.device == "cuda" else t.to(b.device)
                   for t in inputs)
    with torch.no_grad():
        expected = gpu.first(gpu._tensors(model(*inputs)))
        b.sync()
        kiln_frontend.reset()
        compile_timer.reset_reports()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        compiled = kiln.compile(model, options={"codegen": "triton"} if b.device == "cuda" else None)
        got = gpu.first(gpu._tensors(compiled(*inputs)))
        b.sync()
        profiler.disable()
        wall = time.perf_counter() - t0
    tol = {"atol": 5e-2, "rtol": 5e-2} if b.device == "cuda" else {}
    torch.testing.assert_close(got.float(), expected.float(), **tol)
    phases = compile_timer.phase_totals()
    print(f"\n=== {name}: cold first call {wall:.2f} s under cProfile "
          f"(profiling slows Python-heavy phases; compare phases with each other)")
    for k, v in phases.items():
        print(f"  {k:<16} {v:6.2f} s")
    print(f"  {'(not in phases)':<16} {wall - sum(phases.values()):6.2f} s")
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
        text = out.getvalue()
        print(f"--- by {order}\n" + text[text.find("   ncalls"):], flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="vit_base_patch16_224", help="comma-separated (benchmarks/gpu.py names)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="profile the first model with the compile workers not yet started")
    args = parser.parse_args(argv)
    gpu.setup_tree()
    gpu.fresh_caches()
    b = gpu.Bench(args.device, smoke=False)
    models = dict(gpu._models(b))
    if args.warm_up:
        import kiln

        model, inputs = _tiny_mlp(b)()
        model = model.to(args.device)
        kiln.compile(model, options={"codegen": "triton"} if args.device == "cuda" else None)(
            *(t.to(args.device) for t in inputs))
    for name in args.models.split(","):
        profile_model(b, name, models[name], args.top)
    return 0


def _tiny_mlp(b):
    """A small model with enough kernels to start the compile workers."""
    torch = b.torch

    def build():
        layers = []
        for k in range(8):  # distinct widths: distinct kernels
            layers += [torch.nn.Linear(32 + 8 * k, 40 + 8 * k), torch.nn.GELU(), torch.nn.LayerNorm(40 + 8 * k)]
        return torch.nn.Sequential(*layers), (torch.randn(4, 32),)
    return build


if __name__ == "__main__":
    raise SystemExit(main())
