"""Host time of one compiled training step: eager vs torch.compile vs kiln, in one run
(issues 28 and 31: small-batch training pays the Python path around the kernels).

    python benchmarks/step_overhead.py                 # CPU, C++ codegen, every subject
    python benchmarks/step_overhead.py --smoke         # a few calls per variant: does it run
    python benchmarks/step_overhead.py --only mlp,fn8 --rounds 9
    python benchmarks/step_overhead.py --device cuda   # the same on a GPU (host-bound shapes)
    python benchmarks/step_overhead.py --callgrind     # instructions per call (valgrind)

The subjects run on tensors so small that their kernels cost next to nothing, so a step's
time is the host path: guards, the autograd wrapper of the compiled graph, allocations.

- ``mlp``: 3 x (Linear + ReLU), d 16, batch 4;
- ``block``: a pre-norm transformer block of nn modules (LayerNorm, Linear, SDPA, GELU),
  d 16, 2 heads, batch 2, sequence 8;
- ``fn8``: a function of 8 tensors (4 require grad), a pointwise chain and a reduction;
- ``flex``: ``torch.nn.attention.flex_attention`` with a causal score_mod, B1 H2 S16 D8
  (eager flex refuses grads on the CPU: its training rows are empty there).

For each subject and compiler (eager, torch.compile for reference, kiln), in every round,
one after the other so that they share the machine's load alike:

- ``fwd``: the forward under ``torch.no_grad()``;
- ``step``: forward with grad, then ``torch.autograd.backward(outputs, grads)`` (the
  gradients accumulate into ``.grad``, as in a training step without ``zero_grad``), timed as
  ``fwd_grad`` (the forward, building the autograd graph) and ``bwd`` (the backward) per call.

Each number is the median over rounds of a round's mean microseconds per call. The first
calls are checked against eager (outputs, and gradients where eager has them). Writes
``benchmarks/results/step-overhead.json`` (``--json``) with the command in ``meta``, and prints
a table.

``--callgrind`` counts instructions instead (valgrind's callgrind, one child process per
subject and compiler, ``--calls`` calls of each mode after a warm-up; deterministic where
wall time on a shared machine is not): ``fwd`` and ``step`` per call, from the inclusive
counts of ``itertools.starmap`` (the no_grad forwards) and ``itertools.takewhile`` (the
steps), which the timed code does not otherwise use.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    ROOT,
    callgrind_inclusive,
    first_line,
    fresh_cache_dirs,
    markdown_table,
)
from _models import PreNormBlock  # noqa: E402

COMPILERS = ("eager", "torch.compile", "kiln")
MODES = ("fwd", "fwd_grad", "bwd", "step")


# ------------------------------------------------------------------------------ subjects


class MLP(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(),
                                    nn.Linear(d, d), nn.ReLU())

    def forward(self, x):
        return self.layers(x)


def fn8(a, b, c, d, e, f, g, h):
    """8 tensor inputs, ``a``-``d`` requiring grad: a pointwise chain, two outputs."""
    y = torch.tanh(a * e + b) * torch.sigmoid(c - f) + d * g
    return y * h, (y.relu() + a).sum(dim=-1)


def _causal_score(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def flex(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, score_mod=_causal_score)


def subjects(device: str) -> dict[str, tuple[Callable, Callable[[], tuple]]]:
    """name: (the callable to compile, a factory of its inputs, leaves requiring grad first)."""
    torch.manual_seed(0)
    mlp, block = MLP().to(device), PreNormBlock(d=16, heads=2, causal=True).to(device)

    def rand(*shape, grad=False):
        return torch.randn(*shape, device=device, requires_grad=grad)

    return {
        "mlp": (mlp, lambda: (rand(4, 16),)),
        "block": (block, lambda: (rand(2, 8, 16, grad=True),)),
        "fn8": (fn8, lambda: tuple(rand(8, 8, grad=i < 4) for i in range(8))),
        "flex": (flex, lambda: tuple(rand(1, 2, 16, 8, grad=True) for _ in range(3))),
    }


# ------------------------------------------------------------------------------ one variant


def _compiled(fn: Callable, compiler: str) -> Callable:
    if compiler == "eager":
        return fn
    if compiler == "torch.compile":
        return torch.compile(fn)
    if compiler == "kiln":
        import kiln

        return kiln.compile(fn)
    raise ValueError(f"unknown compiler {compiler!r}")


def _outputs(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]


class Variant:
    """One compiled callable with its inputs, the grads fed to its backward and the leaves
    whose ``.grad`` the step fills; ``calls(mode, n)`` runs n calls and returns the seconds
    spent in (forward, backward)."""

    def __init__(self, fn: Callable, inputs: tuple, device: str):
        self.fn, self.inputs, self.device = fn, inputs, device
        #: what the no_grad forward gets: eager flex_attention refuses inputs requiring grad
        #: on the CPU even under no_grad, so it gets them detached
        self.no_grad_inputs = inputs
        with torch.no_grad():
            try:
                fn(*inputs)
            except NotImplementedError:
                self.no_grad_inputs = tuple(x.detach() for x in inputs)
                fn(*self.no_grad_inputs)
        self.params = [p for p in getattr(fn, "parameters", lambda: [])() if p.requires_grad]
        self.diff: list[int] | None = None  # outputs that require grad (known at a step)
        self.grads: list[torch.Tensor] = []

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def forward_no_grad(self, n: int) -> float:
        fn, inputs = self.fn, self.no_grad_inputs
        self.sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(n):
                fn(*inputs)
        self.sync()
        return time.perf_counter() - t0

    def step(self, n: int) -> tuple[float, float]:
        fn, inputs = self.fn, self.inputs
        if self.diff is None:
            outs = _outputs(fn(*inputs))
            self.diff = [i for i, o in enumerate(outs) if o.requires_grad]
            self.grads = [torch.ones_like(outs[i]) for i in self.diff]
        diff, grads = self.diff, self.grads
        backward, clock = torch.autograd.backward, time.perf_counter
        fwd = bwd = 0.0
        self.sync()
        for _ in range(n):
            t0 = clock()
            outs = _outputs(fn(*inputs))
            t1 = clock()
            backward([outs[i] for i in diff], grads)
            t2 = clock()
            fwd += t1 - t0
            bwd += t2 - t1
        self.sync()
        return fwd, bwd

    def grads_now(self) -> list:
        leaves = [x for x in self.inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        return [t.grad for t in leaves + self.params]

    def zero_grads(self) -> None:
        for x in list(self.inputs) + self.params:
            if isinstance(x, torch.Tensor):
                x.grad = None


def _fresh_inputs(inputs: tuple) -> tuple:
    return tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)


def _check(name: str, variants: dict[str, Variant], errors: dict) -> None:
    """The compiled outputs (no_grad) and one step's grads against eager's."""
    ref = variants.get("eager")
    for compiler, v in variants.items():
        if compiler == "eager" or ref is None:
            continue
        try:
            with torch.no_grad():
                for a, b in zip(_outputs(v.fn(*v.no_grad_inputs)),
                                _outputs(ref.fn(*ref.no_grad_inputs)), strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            if "step" not in errors.get((name, "eager"), {}):
                for x in (ref, v):
                    x.zero_grads()
                    x.step(1)
                for a, b in zip(v.grads_now(), ref.grads_now(), strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        except Exception as e:  # reported in the table, the timings still run
            errors.setdefault((name, compiler), {})["check"] = first_line(e, 200)


# ------------------------------------------------------------------------------ main


def _meta(args, load_before) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "packages", "benchmarks"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout.strip()
    return {"command": " ".join(["python", "benchmarks/step_overhead.py", *sys.argv[1:]]),
            "commit": commit, "working_tree_changed": bool(dirty),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__, "device": args.device,
            "threads": torch.get_num_threads(), "rounds": args.rounds,
            "round_s": args.round_s, "calls": args.calls if args.callgrind else None,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


def _callgrind_child(subject: str, compiler: str, n: int, device: str) -> None:
    """Under valgrind: warm up, switch instrumentation on, then ``n`` no_grad forwards through
    ``itertools.starmap`` and ``n`` steps through ``itertools.takewhile``."""
    fn, make_inputs = subjects(device)[subject]
    v = Variant(_compiled(fn, compiler), make_inputs(), device)
    try:
        v.step(20)
        steps = n
    except Exception:  # (eager flex_attention on the CPU: no backward) the forward alone
        steps = 0
    v.forward_no_grad(20)
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL)
    inputs = [v.no_grad_inputs] * n
    with torch.no_grad():
        for _ in itertools.starmap(v.fn, inputs):
            pass
    for _ in itertools.takewhile(lambda _: v.step(1) is not None, range(steps)):
        pass


def _callgrind(subject: str, compiler: str, n: int, device: str, out_dir: str) -> dict:
    """Instructions per call of ``fwd`` (no_grad) and ``step`` (forward+backward)."""
    out = os.path.join(out_dir, f"callgrind.{subject}.{compiler}.out")
    # valgrind decodes no AVX-512: kernels are built without it (a g++ that appends
    # -mno-avx512f to kiln's -march=native), into a cache of their own
    cxx = os.path.join(out_dir, "g++-no-avx512")
    if not os.path.exists(cxx):
        with open(cxx, "w") as f:
            f.write('#!/bin/sh\nexec "${CXX_REAL:-g++}" "$@" -mno-avx512f\n')
        os.chmod(cxx, 0o755)
    env = {**os.environ, "PYTHONHASHSEED": "0",  # the same dict probe paths in every run
           "KILN_CXX": cxx, "KILN_CACHE_DIR": os.path.join(out_dir, "kiln-cache"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(out_dir, "inductor-cache")}
    subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--instr-atstart=no",
                    "--toggle-collect=starmap_next", "--toggle-collect=takewhile_next",
                    f"--callgrind-out-file={out}", sys.executable, __file__,
                    "--callgrind-child", f"{subject},{compiler}", "--calls", str(n),
                    "--device", device], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    inclusive = callgrind_inclusive(out)

    step = inclusive(r":takewhile_next \[")
    return {"fwd_instr": round(inclusive(r":starmap_next \[") / n),
            "step_instr": round(step / n) if step else None}


def _callgrind_main(args, names: list[str], compilers: list[str]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-step-callgrind-") as tmp:
        for name in names:
            for compiler in compilers:
                print(f"[callgrind] {name} {compiler}", file=sys.stderr, flush=True)
                row = {"subject": name, "compiler": compiler}
                try:
                    row.update(_callgrind(name, compiler, args.calls, args.device, tmp))
                except subprocess.CalledProcessError as e:
                    row["errors"] = {"callgrind": (e.stderr or b"").decode()[-200:]}
                print(f"  {row}", file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def _calls_for(seconds: float, one_call_s: float) -> int:
    return max(1, min(20_000, int(seconds / max(one_call_s, 1e-7))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated subjects")
    parser.add_argument("--compilers", default=",".join(COMPILERS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-s", type=float, default=0.15,
                        help="seconds per variant and mode in one round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: the host path, not thread start-up)")
    parser.add_argument("--smoke", action="store_true", help="2 short rounds: does it run")
    parser.add_argument("--json", default=None, help="default: benchmarks/results/"
                        "step-overhead.json (step-overhead-smoke.json with --smoke, "
                        "step-overhead-callgrind.json with --callgrind)")
    parser.add_argument("--callgrind", action="store_true",
                        help="instructions per call under valgrind instead of wall time")
    parser.add_argument("--calls", type=int, default=200, help="with --callgrind: calls per mode")
    parser.add_argument("--callgrind-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.round_s, args.calls = 2, 0.01, 10
    torch.set_num_threads(args.threads)
    if args.callgrind_child:
        _callgrind_child(*args.callgrind_child.split(","), args.calls, args.device)
        return 0
    fresh_cache_dirs("kiln-step-overhead-")
    load_before = os.getloadavg()

    all_subjects = subjects(args.device)
    names = [n for n in args.only.split(",") if n] or list(all_subjects)
    compilers = [c for c in args.compilers.split(",") if c]
    if args.callgrind:
        rows = _callgrind_main(args, names, compilers)
        result = {"meta": _meta(args, load_before), "rows": rows}
        table = markdown_table(
            ["subject", "compiler", "fwd no_grad instructions", "fwd+bwd instructions"],
            [[r["subject"], r["compiler"], _count(r.get("fwd_instr")),
              _count(r.get("step_instr"))] for r in rows])
        result["table"] = table
        print(table)
        path = Path(args.json) if args.json else RESULTS_DIR / "step-overhead-callgrind.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {path}", file=sys.stderr)
        return 0
    errors: dict = {}
    variants: dict[str, dict[str, Variant]] = {}
    for name in names:
        fn, make_inputs = all_subjects[name]
        base = make_inputs()
        variants[name] = {}
        for compiler in compilers:
            print(f"[compile] {name} {compiler}", file=sys.stderr, flush=True)
            try:
                v = Variant(_compiled(fn, compiler), _fresh_inputs(base), args.device)
            except Exception as e:
                errors.setdefault((name, compiler), {})["fwd"] = first_line(e, 200)
                print(f"  failed: {first_line(e, 200)}", file=sys.stderr, flush=True)
                continue
            try:
                v.step(2)  # compiles the training graph
            except Exception as e:
                errors.setdefault((name, compiler), {})["step"] = first_line(e, 200)
                print(f"  step failed: {first_line(e, 200)}", file=sys.stderr, flush=True)
            variants[name][compiler] = v
        _check(name, variants[name], errors)

    # per (subject, compiler, mode): one sample (us per call) per round
    samples: dict[tuple[str, str, str], list[float]] = {}
    calls: dict[tuple[str, str, str], int] = {}
    for r in range(args.rounds):
        print(f"[round {r + 1}/{args.rounds}]", file=sys.stderr, flush=True)
        for name in names:
            for compiler, v in variants[name].items():
                failed = errors.get((name, compiler), {})
                n = calls.setdefault((name, compiler, "fwd"),
                                     _calls_for(args.round_s, v.forward_no_grad(3) / 3))
                samples.setdefault((name, compiler, "fwd"), []).append(v.forward_no_grad(n) / n * 1e6)
                if "step" in failed:
                    continue
                key = (name, compiler, "step")
                if key not in calls:
                    f, b = v.step(3)
                    calls[key] = _calls_for(args.round_s, (f + b) / 3)
                n = calls[key]
                f, b = v.step(n)
                samples.setdefault((name, compiler, "fwd_grad"), []).append(f / n * 1e6)
                samples.setdefault((name, compiler, "bwd"), []).append(b / n * 1e6)
                samples.setdefault(key, []).append((f + b) / n * 1e6)
            line = "  ".join(
                f"{c} {samples[(name, c, 'fwd')][-1]:.1f}/"
                + (f"{samples[(name, c, 'step')][-1]:.1f}" if (name, c, "step") in samples else "-")
                for c in variants[name])
            print(f"  {name:6s} fwd/step us: {line}", file=sys.stderr, flush=True)

    rows = []
    for name in names:
        for compiler in compilers:
            row = {"subject": name, "compiler": compiler}
            for mode in MODES:
                s = samples.get((name, compiler, mode))
                row[f"{mode}_us"] = round(statistics.median(s), 2) if s else None
                row[f"{mode}_us_min"] = round(min(s), 2) if s else None
            if (name, compiler) in errors:
                row["errors"] = errors[(name, compiler)]
            rows.append(row)
    result = {"meta": _meta(args, load_before), "rows": rows}
    table = _table(rows)
    result["table"] = table
    print(table)
    # a smoke run does not overwrite the measured results
    path = Path(args.json) if args.json else \
        RESULTS_DIR / ("step-overhead-smoke.json" if args.smoke else "step-overhead.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {path}", file=sys.stderr)
    return 0


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _table(rows: list[dict]) -> str:
    def us(v):
        return "-" if v is None else f"{v:.1f}"

    by = {(r["subject"], r["compiler"]): r for r in rows}
    out = []
    for r in rows:
        eager = by.get((r["subject"], "eager"), {})
        ratio = (f"{r['step_us'] / eager['step_us']:.2f}x"
                 if r.get("step_us") and eager.get("step_us") else "-")
        note = "; ".join(f"{k}: {v}" for k, v in r.get("errors", {}).items())
        out.append([r["subject"], r["compiler"], us(r["fwd_us"]), us(r["fwd_grad_us"]),
                    us(r["bwd_us"]), us(r["step_us"]), ratio, note[:80]])
    return markdown_table(["subject", "compiler", "fwd no_grad us", "fwd (grad) us", "bwd us",
                           "fwd+bwd us", "step / eager", "notes"], out)


if __name__ == "__main__":
    sys.exit(main())
