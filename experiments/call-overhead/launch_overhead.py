"""Python cost of launching generated Triton kernels, measured on CPU (no GPU needed).

A graph of many small kernels (pointwise, layernorm, softmax: no extern calls) is compiled
with the GPU configuration of the Triton codegen (interpreter off) and run on CPU tensors
with every kernel's final launch replaced by a no-op: Triton's ``JITFunction.run`` (the
first call of a specialization, which compiles on a GPU) returns a stand-in compiled kernel
whose ``run`` is Triton's own launcher class with its C ``launch`` function replaced by a
no-op. What is timed is then exactly the Python a GPU run pays around
the launches: the wrapper (buffer allocations, frees, size arithmetic) and each launcher's
lean path (config, grid, specialization key, stream, the call into the launcher).

Prints, from one run: kernels per call, time per wrapper call, and microseconds per kernel.
The real per-launch cost on a GPU adds Triton's C launcher and the driver (measured by the
lead on the H200). Run before and after a launcher change; numbers from a shared machine
are noisy: compare runs taken back to back.

    python experiments/call-overhead/launch_overhead.py [--layers N] [--calls C] [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # the GPU launch path, not the interpreter's
os.environ.setdefault("KILN_TRITON_AUTOTUNE", "0")  # no GPU to benchmark configs on
os.environ.setdefault("KILN_TRITON_PRECOMPILE", "0")
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-launch-overhead-"))

import torch  # noqa: E402


def model(x, layers: int):
    """A few small kernels per layer: reductions along rows then along columns cannot fuse."""
    for i in range(layers):
        x = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[-1],)) * 1.5 + i)
        x = x - x.mean(0)
        x = x.softmax(-1).t().contiguous() + 1
    return x


def _noop_c_launch(*launch):
    """Triton's C ``launch`` function, replaced by a no-op."""
    return None


class _NoopRun:
    """A compiled kernel's ``run`` (where Triton's own launcher class cannot be built): its
    launch does nothing."""

    def __call__(self, *launch):
        return None


def _noop_launcher():
    """The compiled kernel's ``run``: Triton's own ``CudaLauncher`` (its Python ``__call__``,
    which a GPU launch pays too) with the C ``launch`` function it calls replaced by a no-op;
    a plain no-op where this Triton has no such class."""
    try:
        import triton
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:
        return _NoopRun()
    run = object.__new__(CudaLauncher)
    run.__dict__.update(launch=_noop_c_launch, global_scratch_size=0, global_scratch_align=1,
                        profile_scratch_size=0, profile_scratch_align=1, num_ctas=1, gsan_enabled=False,
                        arg_annotations=(), kernel_signature=b"", launch_cooperative_grid=False,
                        launch_pdl=False)
    triton.runtime.driver.set_active(object())  # no GPU driver here; the no-op needs none
    return run


class _Compiled:
    function, packed_metadata = 0, None

    def __init__(self):
        self.run = _noop_launcher()

    def _init_handles(self):
        pass


class _FakeJit:
    """Stands in for a kernel's ``JITFunction``: same argument names, ``run`` returns a kernel
    whose launch is a no-op."""

    def __init__(self, real):
        self.arg_names = list(real.arg_names)
        self.final = None

    def run(self, *args, grid, warmup, **kw):
        return _Compiled()


def build(layers: int):
    import kiln_codegen_triton.launcher as L
    from kiln_codegen_triton import compile_fx

    x = torch.randn(8, 64)
    gm = torch.fx.symbolic_trace(lambda x: model(x, layers))
    compiled = compile_fx(gm, [x])
    L._lean_launch_enabled = lambda: True  # no GPU driver here: force the GPU launch path
    L._DRIVER[:] = [lambda: 0, lambda device: 0]
    launchers = [v for v in compiled.call.__globals__.values() if isinstance(v, L.TritonLauncher)]
    for ln in launchers:
        ln.fn = _FakeJit(ln.fn)
    return compiled, x, len(launchers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="write the numbers here too")
    a = p.parse_args()
    compiled, x, nkernels = build(a.layers)
    for _ in range(5):  # first calls: config choice, stand-in compiles
        compiled(x)
    per_call = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            compiled(x)
        per_call.append((time.perf_counter() - t0) / a.calls)
    best, med = min(per_call), statistics.median(per_call)
    result = {"kernels": nkernels, "call_us_best": round(best * 1e6, 1), "call_us_median": round(med * 1e6, 1),
              "us_per_kernel_best": round(best * 1e6 / nkernels, 2),
              "us_per_kernel_median": round(med * 1e6 / nkernels, 2)}
    print(f"kernels per call   {nkernels}")
    print(f"wrapper call       {result['call_us_best']:.1f} us best, {result['call_us_median']:.1f} us median")
    print(f"per kernel         {result['us_per_kernel_best']:.2f} us best, "
          f"{result['us_per_kernel_median']:.2f} us median (launch replaced by a no-op)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
