"""GPU benchmark: kiln's Triton codegen against torch.compile (inductor) on one CUDA device.

    bash scripts/device_tests.sh bench_gpu        # on the lent H200 (sets it up, then this)
    python benchmarks/gpu.py                      # a machine where kiln is installed
    python benchmarks/gpu.py --cpu-smoke          # no GPU: every section on tiny sizes, on
                                                  # CPU tensors under TRITON_INTERPRET=1
    python benchmarks/gpu.py --only cos_sin,norms # some sections

Sections (each in its own try/except: an error is recorded in the JSON and the run goes on):

* ``opinfo``: the OpInfo sweep (tests-integration/opinfo_harness.py) on CUDA float32, first
  sample per op, through ``kiln_triton`` and ``inductor`` side by side; pass counts.
* ``cos_sin``: ``cos(x) + sin(y)`` on 2^27 float32 against a device-to-device copy of the
  same size: bandwidth of each (bytes read + written / time) and kiln's and torch.compile's
  share of the copy's.
* ``norms`` (``--only norms``): softmax and layernorm+GELU on 8192x4096 fp16, softmax on
  1024x262144 fp32 (long rows: read twice with the online softmax): time and share of copy
  bandwidth, kiln and torch.compile; then the long-row softmax again with kiln's cooperative
  rows (``KILN_TRITON_COOPERATIVE=1``: K programs per row, the second read from L2), kiln
  only.
* ``models``: fp16 inference, speedup over eager of kiln and torch.compile, cold compile time
  of each: timm resnet50 and vit_base_patch16_224 (batch 32), transformers BERT-base and GPT-2
  built from their configs (batch 8, seq 512).

Every compiled result is compared with eager (``torch.testing.assert_close``; fp16 models with
a tolerance recorded in the JSON); a mismatch is reported, and its numbers are flagged.
Caches (kiln, inductor, Triton) start empty, so first calls are cold compiles. Results:
``$OUT/gpu.json`` and ``$OUT/gpu.png`` when ``$OUT`` is set, else benchmarks/results/.
Timing: ``triton.testing.do_bench`` medians (CUDA events), one run, ratios only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _common import environ

ROOT = Path(__file__).resolve().parent.parent
T0 = time.perf_counter()


def say(*args) -> None:
    print(f"[gpu.py {time.perf_counter() - T0:6.1f}s]", *args, flush=True)


# =============================================================================================
# setup: kiln from the carried tree (no pip install on the lent machine)
# =============================================================================================


def setup_tree() -> str:
    """Put packages/*/src on sys.path and PYTHONPATH, and write the entry points of every
    package (kiln.backends, kiln.codegens) as a dist-info folder there, which is what pip would
    have left: codegens and backends are found through entry points. Returns that folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("entry_points", ROOT / "scripts" / "entry_points.py")
    entry_points = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry_points)
    srcs = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))
    meta = entry_points.write_entry_points()
    paths = [str(meta), *srcs]
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])
    return str(meta)


def fresh_caches() -> str:
    root = tempfile.mkdtemp(prefix="kiln-gpu-bench-")
    os.environ["KILN_CACHE_DIR"] = os.path.join(root, "kiln")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    return root


class Timeout(Exception):
    pass


class time_limit:
    """Raise Timeout in the main thread after ``seconds`` (Python code only)."""

    def __init__(self, seconds: float):
        self.seconds = max(1, int(seconds))

    def __enter__(self):
        def on_alarm(signum, frame):
            raise Timeout(f"over {self.seconds} s")

        self.old = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)
        return False


# =============================================================================================
# measuring
# =============================================================================================


class Bench:
    def __init__(self, device: str, smoke: bool):
        import torch

        self.torch = torch
        self.device = device
        self.smoke = smoke
        self.profile_dir: Path | None = None  # --profile: torch.profiler tables per model
        self.current_model = ""
        self.skip_cudagraphs = False  # --no-cudagraphs: default modes only

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time(self, fn) -> float:
        """Median seconds per call."""
        if self.device == "cuda":
            from triton.testing import do_bench

            return do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e-3
        import statistics

        fn()
        ts = []
        for _ in range(3 if self.smoke else 9):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def cold(self, make):
        """(compiled callable, output of its first call, wall seconds of build + first call)."""
        self.sync()
        t0 = time.perf_counter()
        fn, out = make()
        self.sync()
        return fn, out, time.perf_counter() - t0

    def kiln_fx(self, f, args):
        """kiln through the FX route (no frontend): symbolic_trace -> kiln backend."""
        import torch.fx
        from kiln.backend import kiln_backend

        options = {"codegen": "triton"}
        compiled = kiln_backend(torch.fx.symbolic_trace(f), list(args), options=options)
        return compiled

    def compile_inductor(self, f, mode=None):
        import torch._dynamo

        torch._dynamo.reset()
        return self.torch.compile(f, mode=mode)


def first(x):
    if isinstance(x, (list, tuple)):
        return x[0]
    return x


def bandwidth_case(b: Bench, name: str, f, args, nbytes: int, copy_bw: float, tol: dict,
                   inductor: bool = True) -> dict:
    torch = b.torch
    row: dict = {"name": name, "bytes": nbytes}
    compilers = [("kiln", lambda: b.kiln_fx(f, args))]
    if inductor:
        compilers.append(("torch.compile", lambda: b.compile_inductor(f)))
    with torch.no_grad():
        expected = f(*args)
        for label, make in compilers:
            try:
                fn, out, cold = b.cold(lambda make=make: (lambda g: (g, g(*args)))(make()))
                torch.testing.assert_close(first(out), expected, **tol)
                t = b.time(lambda fn=fn: fn(*args))
                bw = nbytes / t
                row[label] = {"ok": True, "cold_s": round(cold, 3), "ms": round(t * 1e3, 4),
                              "GBps": round(bw / 1e9, 1), "pct_copy": round(100 * bw / copy_bw, 1)}
            except Exception as e:
                row[label] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            say(f"  {name} {label}: {row[label]}")
    return row


def copy_bandwidth(b: Bench, numel: int, dtype) -> float:
    torch = b.torch
    src = torch.randn(numel, device=b.device).to(dtype)
    dst = torch.empty_like(src)
    t = b.time(lambda: dst.copy_(src))
    return 2 * src.element_size() * numel / t


# =============================================================================================
# sections
# =============================================================================================


def section_cos_sin(b: Bench) -> dict:
    torch = b.torch
    n = 1 << (12 if b.smoke else 27)
    copy_bw = copy_bandwidth(b, n, torch.float32)
    say(f"cos_sin: copy bandwidth {copy_bw / 1e9:.1f} GB/s on {n} float32")
    x, y = torch.randn(n, device=b.device), torch.randn(n, device=b.device)

    def f(x, y):
        return torch.cos(x) + torch.sin(y)

    row = bandwidth_case(b, "cos(x)+sin(y)", f, (x, y), 3 * 4 * n, copy_bw, {})
    return {"numel": n, "copy_GBps": round(copy_bw / 1e9, 1), "result": row}


def section_norms(b: Bench) -> dict:
    torch = b.torch
    F = torch.nn.functional
    rows, cols = (64, 128) if b.smoke else (8192, 4096)
    lrows, lcols = (4, 8192) if b.smoke else (1024, 262144)
    out: dict = {}
    half = torch.float16 if b.device == "cuda" else torch.float32  # fp16 CPU math is slow/odd
    copy_h = copy_bandwidth(b, rows * cols, half)
    copy_f = copy_bandwidth(b, lrows * lcols, torch.float32)
    out["copy_GBps"] = {"fp16": round(copy_h / 1e9, 1), "fp32_long": round(copy_f / 1e9, 1)}
    x = torch.randn(rows, cols, device=b.device).to(half)
    w = torch.randn(cols, device=b.device).to(half)
    bias = torch.randn(cols, device=b.device).to(half)
    el = x.element_size()
    tol16 = {"atol": 2e-2, "rtol": 2e-2}

    def softmax(x):
        return torch.softmax(x, -1)

    def ln_gelu(x, w, bias):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, bias))

    out["softmax_fp16"] = bandwidth_case(b, f"softmax {rows}x{cols} {half}", softmax, (x,),
                                         2 * el * x.numel(), copy_h, tol16)
    out["layernorm_gelu_fp16"] = bandwidth_case(b, f"layernorm+gelu {rows}x{cols} {half}", ln_gelu,
                                                (x, w, bias), 2 * el * x.numel(), copy_h, tol16)
    xl = torch.randn(lrows, lcols, device=b.device)
    out["softmax_long_fp32"] = bandwidth_case(b, f"softmax {lrows}x{lcols} float32", softmax, (xl,),
                                              2 * 4 * xl.numel(), copy_f, {"atol": 1e-6, "rtol": 1e-4})
    # the same with cooperative rows (off by default; under --cpu-smoke the interpreter never
    # takes it, see kiln_codegen_triton/cooperative.py); no graph cache: a fresh compile
    with environ(KILN_TRITON_COOPERATIVE="1", KILN_GRAPH_CACHE="0"):
        out["softmax_long_fp32_cooperative"] = bandwidth_case(
            b, f"softmax {lrows}x{lcols} float32 cooperative", softmax, (xl,), 2 * 4 * xl.numel(),
            copy_f, {"atol": 1e-6, "rtol": 1e-4}, inductor=False)
    return out


def _models(b: Bench):
    """(name, build() -> (module, inputs tuple)) for the section's models."""
    torch = b.torch
    if b.smoke:
        def mlp():
            m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                    torch.nn.Linear(64, 8))
            return m, (torch.randn(4, 32),)
        return [("tiny_mlp", mlp)]
    sys.path.insert(0, str(ROOT / "tests-integration"))
    try:
        import _torchvision_shim

        _torchvision_shim.install()
    except Exception:
        pass

    def timm_model(name):
        def build():
            import timm

            m = timm.create_model(name, pretrained=False)
            return m, (torch.randn(32, 3, 224, 224),)
        return build

    def bert():
        from transformers import BertConfig, BertModel

        m = BertModel(BertConfig())
        return m, (torch.randint(0, 30000, (8, 512)),)

    def gpt2():
        from transformers import GPT2Config, GPT2Model

        m = GPT2Model(GPT2Config())
        return m, (torch.randint(0, 50000, (8, 512)),)

    return [("resnet50", timm_model("resnet50")), ("vit_base_patch16_224", timm_model("vit_base_patch16_224")),
            ("bert_base", bert), ("gpt2", gpt2)]


def section_models(b: Bench, deadline: float) -> dict:
    torch = b.torch
    import kiln

    results = {}
    tol = {"atol": 5e-2, "rtol": 5e-2}
    for name, build in _models(b):
        left = deadline - time.perf_counter()
        if left < 45:
            results[name] = {"error": "skipped: out of time"}
            say(f"models: {name} skipped (out of time)")
            continue
        row: dict = {}
        b.current_model = name
        try:
            with time_limit(left):
                model, inputs = build()
                model = model.eval().to(b.device)
                if b.device == "cuda":
                    model = model.half()
                inputs = tuple(t.to(b.device).half() if t.is_floating_point() and b.device == "cuda"
                               else t.to(b.device) for t in inputs)
                with torch.no_grad():
                    expected = first(_tensors(model(*inputs)))
                    row["eager_ms"] = round(b.time(lambda m=model, xs=inputs: m(*xs)) * 1e3, 3)
                    for label in MODEL_COMPILERS:
                        if label.endswith("reduce-overhead") and (b.device != "cuda" or b.skip_cudagraphs):
                            continue
                        row[label] = _model_compiler(b, label, model, inputs, expected, tol, row["eager_ms"])
                        say(f"models: {name} {label}: {row[label]}")
                    if "kiln" in row:
                        row["kiln_stats"] = str(kiln.stats())[:600]
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            say(f"models: {name} error {row['error']}")
        results[name] = row
        if b.device == "cuda":
            torch.cuda.empty_cache()

    def gm(label):
        xs = [r[label]["speedup"] for r in results.values()
              if isinstance(r.get(label), dict) and r[label].get("ok") and r[label].get("speedup")]
        return round(math.exp(sum(map(math.log, xs)) / len(xs)), 3) if xs else None

    return {"tolerance": tol, "models": results,
            "geomean_speedup": {label: gm(label) for label in MODEL_COMPILERS}}


#: the compilers the models section runs: the default modes (the headline), then both with
#: CUDA graphs (``mode="reduce-overhead"``), which removes the per-kernel launch cost
MODEL_COMPILERS = ("torch.compile", "kiln", "torch.compile reduce-overhead", "kiln reduce-overhead")


def _model_compiler(b: Bench, label: str, model, inputs, expected, tol: dict, eager_ms: float) -> dict:
    """Cold compile + first call, correctness against eager, steady-state time of one compiler."""
    torch = b.torch
    try:
        mode = "reduce-overhead" if label.endswith("reduce-overhead") else None
        if label.startswith("kiln"):
            import kiln
            import kiln_frontend
            from kiln_runtime import compile_timer

            kiln_frontend.reset()
            compile_timer.reset_reports()

            def make():
                g = kiln.compile(model, mode=mode, options={"codegen": "triton"})
                return g, g(*inputs)
        else:
            def make():
                g = b.compile_inductor(model, mode=mode)
                return g, g(*inputs)
        compiled, out, cold = b.cold(make)
        # where kiln's cold compile went, summed over its graphs
        phases = compile_timer.phase_totals() if label.startswith("kiln") else {}
        got = first(_tensors(out))
        err = (got.float() - expected.float()).abs().max().item()
        try:
            torch.testing.assert_close(got.float(), expected.float(), **tol)
            ok = True
        except AssertionError:
            ok = False
        del out, got  # (CUDA graphs: a later replay overwrites the outputs)
        t = b.time(lambda: compiled(*inputs))
        row = {"ok": ok, "max_abs_err": err, "cold_s": round(cold, 2), "ms": round(t * 1e3, 3),
               "speedup": round(eager_ms / (t * 1e3), 3)}
        if phases:
            row["compile_phases_s"] = {k: round(v, 2) for k, v in phases.items()}  # (largest first)
        if mode is not None:
            row["note"] = "cold_s with the kernels already compiled by the default-mode row"
        if label.startswith("kiln"):
            from kiln_runtime import counters

            row["counters"] = {k: int(counters[k]) for k in ("triton_lean_launch_kernels", "triton_autotune_runs",
                                                             "triton_autotune_cache_hits") if k in counters}
        if b.profile_dir is not None:
            row["gpu_ms"] = profile_calls(b, f"{b.current_model}-{label}", lambda: compiled(*inputs))
        return row
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}


def profile_calls(b: Bench, tag: str, fn, calls: int = 5) -> float:
    """torch.profiler over a few calls: the per-kernel table goes to ``profile-<tag>.txt``;
    returns the GPU kernel time per call (ms): against the wall time per call, whether the
    compiled code is bound by the GPU or by launching."""
    from torch.profiler import ProfilerActivity, profile

    torch = b.torch
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    gpu_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events
                 if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)) / calls
    table = events.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90)
    tag = tag.replace("/", "_").replace(" ", "_").replace(".", "_")
    (b.profile_dir / f"profile-{tag}.txt").write_text(
        f"{tag}: GPU kernel time per call {gpu_us / 1e3:.3f} ms over {calls} calls\n{table}\n")
    return round(gpu_us / 1e3, 3)


def _tensors(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in out for t in _tensors(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in _tensors(x)]
    if hasattr(out, "to_tuple"):
        return _tensors(out.to_tuple())
    return []


def section_opinfo(b: Bench, out_dir: Path, budget: float) -> dict:
    env = dict(os.environ, KILN_OPINFO_DEVICE=b.device)
    backends = "kiln_triton,inductor"
    limit = "12" if b.smoke else "411"
    base = out_dir / "opinfo-gpu"
    cmd = [sys.executable, str(ROOT / "tests-integration" / "opinfo_harness.py"), "--backends", backends,
           "--samples", "1", "--limit", limit, "--timeout", "60", "--jobs", "2" if b.smoke else "12",
           "--out", str(base)]
    say("opinfo:", " ".join(cmd), f"(budget {budget:.0f} s)")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30, budget))
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail = f"timed out after {budget:.0f} s\n" + out[-3000:]
    data_path = Path(str(base) + ".json")
    if not data_path.exists():  # cut short: the running counts of its last progress line
        import re

        counts = {}
        lines = [ln for ln in tail.splitlines() if ln.startswith("[") and " | " in ln]
        if lines:
            for be in backends.split(","):
                m = re.search(rf"\b{re.escape(be)} (\d+)/(\d+)", lines[-1])
                if m:
                    counts[be] = {"pass": int(m.group(1)), "tested": int(m.group(2))}
            counts["progress"] = lines[-1].split("]")[0] + "]"
        return {"error": "no results file (cut short)", "partial_counts": counts, "tail": tail[-1500:]}
    data = json.loads(data_path.read_text())
    rows = data.get("results") or data.get("ops") or []
    counts = {}
    for be in backends.split(","):
        statuses = [r["backends"].get(be, {}).get("status") for r in rows]
        tested = [s for s in statuses if s in ("pass", "fail")]
        counts[be] = {"pass": statuses.count("pass"), "tested": len(tested)}
    say("opinfo:", counts)
    return {"counts": counts, "ops": len(rows), "results_file": str(data_path), "tail": tail[-800:]}


# =============================================================================================
# report
# =============================================================================================


def plot(results: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"no plot: {e}"
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    labels, kiln, ind = [], [], []
    bw = []
    cs = results.get("cos_sin", {}).get("result")
    if cs:
        bw.append(cs)
    for k in ("softmax_fp16", "layernorm_gelu_fp16", "softmax_long_fp32", "softmax_long_fp32_cooperative"):
        r = results.get("norms", {}).get(k)
        if isinstance(r, dict):
            bw.append(r)
    for r in bw:
        labels.append(r["name"])
        kiln.append((r.get("kiln") or {}).get("pct_copy", 0) or 0)
        ind.append((r.get("torch.compile") or {}).get("pct_copy", 0) or 0)
    xs = range(len(labels))
    axes[0].bar([x - 0.2 for x in xs], kiln, 0.4, label="kiln (Triton)")
    axes[0].bar([x + 0.2 for x in xs], ind, 0.4, label="torch.compile")
    axes[0].set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
    axes[0].set_ylabel("% of device-to-device copy bandwidth")
    axes[0].legend()
    models = results.get("models", {}).get("models", {})
    names = list(models)
    labels_m = [lab for lab in MODEL_COMPILERS if any(isinstance(models[n].get(lab), dict) for n in names)]
    xs = range(len(names))
    width = 0.8 / max(1, len(labels_m))
    for i, lab in enumerate(labels_m):
        vals = [((models[n].get(lab) or {}).get("speedup") or 0) for n in names]
        axes[1].bar([x - 0.4 + width * (i + 0.5) for x in xs], vals, width, label=lab)
    axes[1].axhline(1.0, color="gray", lw=0.8)
    axes[1].set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    axes[1].set_ylabel("fp16 inference speedup over eager")
    axes[1].legend()
    # cold compile (build + first call) of the default modes, with kiln's share written on top
    for i, lab in enumerate(("torch.compile", "kiln")):
        vals = [((models[n].get(lab) or {}).get("cold_s") or 0) for n in names]
        axes[2].bar([x - 0.2 + 0.4 * i for x in xs], vals, 0.4, label=lab)
    for x, n in zip(xs, names, strict=True):
        tc, kn = ((models[n].get(lab) or {}).get("cold_s") for lab in ("torch.compile", "kiln"))
        if tc and kn:
            axes[2].annotate(f"{kn / tc:.2f}", (x + 0.2, kn), ha="center", va="bottom", fontsize=8)
    axes[2].set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    axes[2].set_ylabel("cold compile s (kiln / torch.compile on top)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU under TRITON_INTERPRET=1")
    p.add_argument("--only", default="",
                   help="comma-separated: cos_sin,norms,models,opinfo (norms: softmax and "
                        "layernorm+GELU, the long-row softmax's %% of copy bandwidth, with and "
                        "without cooperative rows)")
    p.add_argument("--budget", type=float, default=520.0, help="seconds for the whole run")
    p.add_argument("--profile", action="store_true",
                   help="models: torch.profiler per compiled model (profile-<model>-<compiler>.txt)")
    p.add_argument("--no-cudagraphs", action="store_true",
                   help="models: skip the reduce-overhead (CUDA graphs) rows")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    setup_tree()
    cache_root = fresh_caches()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = T0 + args.budget
    import torch

    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        say("no CUDA device: use --cpu-smoke")
        return 2
    b = Bench(device, args.cpu_smoke)
    b.skip_cudagraphs = args.no_cudagraphs
    if args.profile and device == "cuda":
        b.profile_dir = out_dir
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "device": device,
           "cache_root": cache_root}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as e:
        env["triton"] = f"not importable: {e}"
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    say("env", env)
    results: dict = {"env": env, "argv": sys.argv[1:]}
    only = set(filter(None, args.only.split(","))) or {"cos_sin", "norms", "models", "opinfo"}
    out_json = out_dir / ("gpu-smoke.json" if args.cpu_smoke else "gpu.json")

    def save():
        results["elapsed_s"] = round(time.perf_counter() - T0, 1)
        out_json.write_text(json.dumps(results, indent=1, default=str))

    sections = [
        ("cos_sin", lambda: section_cos_sin(b)),
        ("norms", lambda: section_norms(b)),
        ("models", lambda: section_models(b, deadline - 170 if "opinfo" in only else deadline)),
        ("opinfo", lambda: section_opinfo(b, out_dir, deadline - time.perf_counter() - 15)),
    ]
    for name, run in sections:
        if name not in only:
            continue
        say(f"== {name}")
        try:
            results[name] = run()
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            say(f"{name} failed: {type(e).__name__}: {e}")
        save()
    err = plot(results, out_dir / ("gpu-smoke.png" if args.cpu_smoke else "gpu.png"))
    if err:
        results["plot"] = err
    save()
    say("results in", out_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
