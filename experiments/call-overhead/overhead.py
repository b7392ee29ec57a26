"""Per-call overhead of compiled code: guards + dispatch, not kernels.

For each workload (a tiny function, a 20-layer Linear stack, timm resnet18 and ViT-tiny at
batch 1 on one thread; models built with random weights, no download) it runs, in one
process: eager, ``kiln_frontend.compile(backend=<eager>)`` and
``torch.compile(backend="eager")``, and prints

* ``guards us``: the root frame's guard check alone (kiln's ``GuardTree``, checked in C;
  torch's guard manager ``check``), called on the same inputs: the part of the overhead
  that grows with the number of parameters and modules, timed without the model's own run
  time as noise, kiln and torch in turns (3 x repeats turns of at least 2000 calls; the
  fastest turn of each);
* ``overhead us``: compiled time per call minus eager's (noisy on large models: the model's
  own run time varies more than the overhead on a loaded machine);
* the ratios kiln / torch.compile of both.  Target: guards ratio <= 1.00x on models with
  hundreds of parameters (issue 10).

Ratios are from one run (the machine is shared); run it twice to see the spread.

    python experiments/call-overhead/overhead.py [--calls N] [--repeats R] [--models a,b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import kiln_frontend
import torch
from kiln_frontend.eval_frame import cache_entries


def tiny(x, y):
    return x + y


def _tiny():
    return tiny, (torch.randn(4), torch.randn(4))


def _linear_stack():
    torch.manual_seed(0)
    layers = []
    for _ in range(20):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 16),)


def _timm(name, **kw):
    def build():
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests-integration"))
        import _torchvision_shim

        _torchvision_shim.install()
        import timm

        torch.manual_seed(0)
        size = kw.get("img_size", 224)
        model = timm.create_model(name, pretrained=False, **kw).eval()
        return model, (torch.randn(1, 3, size, size),)

    return build


WORKLOADS = {
    "tiny": _tiny,
    "linear20": _linear_stack,
    "resnet18": _timm("resnet18"),
    "vit_tiny": _timm("vit_tiny_patch16_224"),
}


def _eager_backend(gm, example_inputs):
    return gm.forward


def time_interleaved(fns: dict, calls: int, repeats: int) -> dict:
    """Per-call time of each of ``fns``, timed in turns (kiln, torch, kiln, ...) and the
    fastest turn kept: a guard check is deterministic work, so the minimum is its cost and
    a load spike on a shared machine hits both sides alike instead of one."""
    for fn in fns.values():
        for _ in range(20):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=calls) / calls)
    return best


def time_per_call(fn, calls: int, repeats: int) -> float:
    for _ in range(20):
        fn()  # warm-up: compile and fill caches
    samples = timeit.repeat(fn, number=calls, repeat=repeats)
    return statistics.median(samples) / calls


def call_model(model, x):
    """The root frame for models, the same for kiln and torch.compile (whose compiled
    module's own root frame is torch's ``_call_impl``): its guards check the model."""
    return model(x)


def _as_function(target, args):
    if isinstance(target, torch.nn.Module):
        return call_model, (target, *args)
    return target, tuple(args)


def kiln_guard_fn(fn, args):
    """kiln's check (a ``GuardTree``) for the root frame, on these inputs."""
    entries = cache_entries(fn.__code__)
    assert len(entries) == 1, f"expected one cache entry, got {len(entries)}"
    check = entries[0][0]
    assert check(*args), check.failure_reason(*args)
    return lambda: check(*args)


def torch_guard_fn(fn, args):
    """torch.compile's guard manager for the root frame, on these inputs (benchmark only:
    product code never imports torch._dynamo)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = fn.__code__
    f_locals = dict(zip(code.co_varnames[:code.co_argcount], args, strict=True))
    for entry in _debug_get_cache_entry_list(code):
        manager = entry.guard_manager
        if manager.check(f_locals):
            return lambda: manager.check(f_locals)
    raise AssertionError(f"no torch.compile cache entry of {code.co_name} passes")


def run(name, calls: int, repeats: int) -> dict:
    target, args = _as_function(*WORKLOADS[name]())
    torch._dynamo.reset()
    kiln_frontend.reset()
    variants = {
        "eager": target,
        "kiln": kiln_frontend.compile(target, backend=_eager_backend),
        "torch": torch.compile(target, backend="eager"),
    }
    with torch.no_grad():
        expected = target(*args)
        for vname, fn in variants.items():
            torch.testing.assert_close(fn(*args), expected, msg=f"{name}: {vname} is wrong")
        times = {v: time_per_call(lambda fn=fn: fn(*args), calls, repeats)
                 for v, fn in variants.items()}
        guards = time_interleaved({"kiln": kiln_guard_fn(target, args),
                                   "torch": torch_guard_fn(target, args)},
                                  max(calls, 2000), 3 * repeats)
    check = cache_entries(target.__code__)[0][0]
    return {"times": times, "guards": guards, "n_guards": len(check.guards)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    print(f"{'workload':10} {'guards':>6} {'kiln guards us':>15} {'torch guards us':>16} "
          f"{'ratio':>6} {'kiln over us':>13} {'torch over us':>14} {'ratio':>6}")
    for name in args.models.split(","):
        print(f"timing {name} ...", file=sys.stderr, flush=True)
        calls = args.calls if name in ("tiny", "linear20") else max(args.calls // 20, 10)
        r = run(name, calls, args.repeats)
        t, g = r["times"], r["guards"]
        kiln_over, torch_over = t["kiln"] - t["eager"], t["torch"] - t["eager"]
        over_ratio = kiln_over / torch_over if torch_over > 0 else float("inf")
        print(f"{name:10} {r['n_guards']:6d} {g['kiln'] * 1e6:15.2f} {g['torch'] * 1e6:16.2f} "
              f"{g['kiln'] / g['torch']:6.2f} {kiln_over * 1e6:13.2f} {torch_over * 1e6:14.2f} "
              f"{over_ratio:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
