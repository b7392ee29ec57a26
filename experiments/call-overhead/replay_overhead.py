"""Per-call Python cost of a compiled graph after the guard check (issue 13), on CPU.

Two measurements, each on a graph so small that its kernels cost next to nothing:

* **runner**: ``kiln_runtime.cudagraphs.CudaGraphRunner`` replaying a one-input graph through
  an engine whose capture runs the function once and whose replay does nothing, so what is
  timed is the runner's bookkeeping: entry lookup, input copy, slot choice (output liveness),
  handing out outputs. Two call patterns: the result dropped at once, and ``out = runner(x)``
  in a loop (the previous output is still held at each call). ``--baseline REV`` times the
  runner of git revision ``REV`` (its ``cudagraphs.py`` loaded from ``git show``) in the same
  run, interleaved, for a before/after ratio.
* **kiln call path**: a 1x1 conv+BatchNorm (folded: the weights guard is on) followed by 40
  per-channel scales (``ConvBnScales``: resnet18's count of parameters and modules, little
  compute), compiled by the ``kiln`` backend, cold (the pipeline's result) and from the graph
  cache (a hit's result), in the default mode and in ``reduce-overhead`` (the no-op engine
  swapped in: on CPU the runner would skip, "CPU tensors"). First the generated ``call(list)``
  alone (the kernels), then the whole compiled callable with that ``call`` replaced by one
  returning its outputs: ``kiln's layers`` is what kiln adds around the kernels.

Numbers are microseconds per call, the median of ``--repeats`` runs of ``--calls`` calls;
the machine is shared, so compare rows from one run.

    python experiments/call-overhead/replay_overhead.py [--calls N] [--repeats R] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_SRC = "packages/runtime/src/kiln_runtime/cudagraphs.py"


class NoopEngine:
    """Capture runs ``fn`` once (its outputs are the recorded buffers); replay does nothing."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.pool = object()

    def capture(self, fn, inputs):
        outputs = fn(list(inputs))
        return None, list(outputs), 0

    def replay(self, handle) -> None:
        pass


def per_call_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(calls)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def dropping(call, x):
    def loop(n):
        for _ in range(n):
            call(x)
    return loop


def holding(call, x):
    def loop(n):
        out = None
        for _ in range(n):
            out = call(x)
        del out
    return loop


# ------------------------------------------------------------------------------ the runner


def _runner_module(rev: str | None):
    if rev is None:
        from kiln_runtime import cudagraphs

        return cudagraphs
    source = subprocess.run(["git", "show", f"{rev}:{RUNTIME_SRC}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"cudagraphs_{rev.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"cudagraphs_{abs(hash(rev))}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def bench_runner(calls: int, repeats: int, baseline: str | None) -> list[tuple[str, float]]:
    x = torch.randn(8)

    def graph(args):
        return [args[0] + 1]

    versions = [("now", _runner_module(None))]
    if baseline:
        versions.append((baseline, _runner_module(baseline)))
    runners = {}
    for label, module in versions:
        runner = module.CudaGraphRunner(graph, name=f"bench-{label}", engine=NoopEngine())
        for _ in range(4):  # warm-up, then record alias slots and the copy slot
            held = runner(x)
        del held
        runners[label] = runner
    rows = [("graph itself", per_call_us(dropping(lambda a: graph([a]), x), calls, repeats))]
    for pattern, make in (("dropped", dropping), ("held", holding)):
        for label, runner in runners.items():  # interleaved: same load for both
            rows.append((f"runner {label} ({pattern})", per_call_us(make(runner, x), calls,
                                                                       repeats)))
    return rows


# ----------------------------------------------------------------------- kiln's call path


class Scale(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(channels, 1, 1) + 0.5)

    def forward(self, x):
        return x * self.weight


class ConvBnScales(torch.nn.Module):
    """A 1x1 conv with a BatchNorm (folded into it: the compiled graph holds constants derived
    from weights, so the weights guard is on) and 40 per-channel scales (elementwise: one fused
    kernel): about resnet18's count of parameters and modules, with little compute."""

    def __init__(self, channels: int = 4, scales: int = 40):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.scales = torch.nn.Sequential(*[Scale(channels) for _ in range(scales)])

    def forward(self, x):
        return (self.scales(torch.relu(self.bn(self.conv(x)))),)


def _layers(obj):
    """The chain of kiln's wrappers from ``obj`` down to the generated ``CompiledGraph``
    (following ``compiled`` / ``flat`` / ``fn`` links)."""
    chain = [obj]
    while type(obj).__name__ != "CompiledGraph":
        obj = next((getattr(obj, a) for a in ("compiled", "flat", "fn")
                    if getattr(obj, a, None) is not None), None)
        if obj is None or any(obj is o for o in chain):
            raise LookupError("no CompiledGraph behind the compiled callable")
        chain.append(obj)
    return chain


def _with_noop_engine(compiled) -> None:
    """Make the CPU graph's runner record and replay with the no-op engine (benchmark only:
    on CPU it would skip)."""
    runner = next(getattr(o, "runner", o) for o in _layers(compiled)  # older: ``run.runner``
                  if type(getattr(o, "runner", o)).__name__ == "CudaGraphRunner")
    runner._engine = NoopEngine()
    runner.skip_reason = None


def bench_call_path(calls: int, repeats: int) -> list[tuple[str, float]]:
    import kiln.cache
    from kiln.backend import kiln_backend

    torch.manual_seed(0)
    model = ConvBnScales().eval()
    x = torch.randn(1, 4, 2, 2)
    gm = torch.fx.symbolic_trace(model)
    expected = model(x)
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["KILN_CACHE_DIR"] = cache_dir
        for mode in (None, "reduce-overhead"):
            with torch.no_grad():  # inference: what a frontend compiles under no_grad
                cold = kiln_backend(gm, [x], {"mode": mode})
                kiln.cache.flush()
                hit = kiln_backend(gm, [x], {"mode": mode})
            for label, compiled in (("cold", cold), ("cache hit", hit)):
                if mode is not None:
                    _with_noop_engine(compiled)
                with torch.no_grad():
                    for _ in range(4):  # warm-up and recordings
                        torch.testing.assert_close(compiled(x), expected)
                    graph = _layers(compiled)[-1]
                    name = f"kiln {mode or 'default'} {label}"
                    # the wrapper empties its argument list (it frees inputs early): a new one
                    rows.append((f"{name}: generated call(list)",
                                 per_call_us(dropping(lambda a, g=graph: g.call([a]), x), calls,
                                             repeats)))
                    outputs = graph.call([x])
                    graph.call = lambda args, outputs=outputs: outputs  # no kernels from now
                    rows.append((f"{name}: kiln's layers", per_call_us(dropping(compiled, x),
                                                                        calls, repeats)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="git revision whose runner to time too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = bench_runner(args.calls, args.repeats, args.baseline)
    rows += bench_call_path(max(args.calls // 4, 100), args.repeats)
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  us/call")
    for name, us in rows:
        print(f"{name:{width}}  {us:7.2f}")


if __name__ == "__main__":
    os.environ.setdefault("KILN_LOGS", "")
    sys.exit(main())
