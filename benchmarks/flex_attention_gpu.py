"""FlexAttention on CUDA: eager ``flex_attention``, ``torch.compile(flex_attention)`` and
``kiln.compile`` (fused Triton forward and backward kernels), with SDPA's causal
flash kernel as the reference, for causal, sliding-window, document masks and ALiBi (a causal
mask plus a captured per-head slope table); and decoding (a short query over a long kv
cache, B32 H16 q 1 kv 8192 by default: kiln's split-KV decoding kernel, torch's flex
decoding kernel), forward only. Forward and forward+backward times (CUDA events,
median of --reps after warm-up), each compiled result checked against eager (or, where eager
does not fit, against torch.compile) with ``torch.testing.assert_close`` at bf16 tolerances.

    python benchmarks/flex_attention_gpu.py            # B4 H16 D64 bf16, L 1024/4096/8192
    python benchmarks/flex_attention_gpu.py --smoke    # tiny, on the CPU (Triton interpreter)
    python benchmarks/flex_attention_gpu.py --lengths 8192 --merge   # one length, merged in
    python benchmarks/flex_attention_gpu.py --patterns decode decode_alibi --merge  # decoding only

Writes benchmarks/results/flex_attention_gpu.json (``--smoke``: flex_attention_gpu_smoke.json)
and prints a table. A case that fails (out of memory: eager's dense scores at L 8192 are
17 GB in float32) records its error and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings

SMOKE = "--smoke" in sys.argv
if SMOKE:  # before triton is imported: kiln's Triton path on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kiln  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------------- the cases


def make_case(name: str, B: int, H: int, L: int, device: str, block: int, window: int):
    """(score_mod or None, mask_mod) for a pattern; tables live on ``device``."""

    def causal(b, h, m, n):
        return m >= n

    if name == "causal":
        return None, causal
    if name == "sliding_window":
        def sliding(b, h, m, n):
            return (m >= n) & (m - n < window)
        return None, sliding
    if name == "document":
        g = torch.Generator().manual_seed(0)
        cuts = sorted(torch.randperm(L - 1, generator=g)[: max(1, L // 512)].add(1).tolist())
        docs = torch.zeros(L, dtype=torch.int32)
        for c in cuts:
            docs[c:] += 1
        docs = docs.to(device)

        def document(b, h, m, n):
            return (docs[m] == docs[n]) & (m >= n)
        return None, document
    if name == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], device=device)

        def alibi(s, b, h, m, n):
            return s + slopes[h] * (n - m)
        return alibi, causal
    raise KeyError(name)


PATTERNS = ("causal", "sliding_window", "document", "alibi")
#: decoding: a --decode-q row query over a --decode-kv cache (the query is the cache's end)
DECODE_PATTERNS = ("decode", "decode_alibi")


# ------------------------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device: str, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def attempt(record: dict, key: str, fn):
    """Run ``fn``; on failure record the error under ``key`` and return None."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (one failing case must not stop the sweep)
        record[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        else:
            traceback.print_exc(limit=3)
        return None


def compare(record: dict, key: str, got, want, tol: float) -> None:
    if got is None or want is None:
        return
    diff = (got.float() - want.float()).abs().max().item()
    record[f"{key}_max_abs_diff"] = diff
    try:
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        record[f"{key}_correct"] = True
    except AssertionError:
        record[f"{key}_correct"] = False


# ------------------------------------------------------------------------------- one case


def run_case(pattern: str, L: int, a, device: str, dtype: torch.dtype) -> dict:
    B, H, D = a.B, a.H, a.D
    rec: dict = {"pattern": pattern, "B": B, "H": H, "L": L, "D": D, "dtype": str(dtype)}
    score_mod, mask_mod = make_case(pattern, B, H, L, device, a.block, a.window)
    bm = create_block_mask(mask_mod, 1, 1, L, L, device=device, BLOCK_SIZE=a.block)
    rec["block_density"] = round(1.0 - bm.sparsity() / 100.0, 4)

    def attend(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    g = torch.Generator(device=device).manual_seed(L)
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, generator=g) for _ in range(3))
    grad = torch.randn(B, H, L, D, device=device, dtype=dtype, generator=g)
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 2e-4
    reps, warmup = a.reps, a.warmup

    torch._dynamo.reset()
    kiln.reset()
    tc = torch.compile(attend, fullgraph=True, mode=a.mode)
    kc = kiln.compile(attend, fullgraph=True, mode=a.mode)

    # forward (no grad: kiln's fused kernel)
    outs = {}
    for key, fn in (("eager", attend), ("torch_compile", tc), ("kiln", kc)):
        with torch.no_grad():
            if key != "eager":
                t0 = time.perf_counter()
                out = attempt(rec, f"fwd_{key}_error", lambda fn=fn: fn(q, k, v, bm))
                sync(device)
                rec[f"cold_{key}_s"] = round(time.perf_counter() - t0, 2)
            else:
                out = attempt(rec, f"fwd_{key}_error", lambda fn=fn: fn(q, k, v, bm))
            outs[key] = out.clone() if out is not None else None  # (a CUDA graph reuses it)
            if out is not None:
                rec[f"fwd_{key}_ms"] = attempt(rec, f"fwd_{key}_error",
                                               lambda fn=fn: timed_ms(lambda: fn(q, k, v, bm), device,
                                                                      reps, warmup))
    reference = outs["eager"] if outs["eager"] is not None else outs["torch_compile"]
    rec["reference"] = "eager" if outs["eager"] is not None else "torch_compile"
    compare(rec, "fwd_kiln", outs["kiln"], reference, tol)
    compare(rec, "fwd_torch_compile", outs["torch_compile"], outs["eager"], tol)
    if pattern == "causal":
        with torch.no_grad():
            sdpa = attempt(rec, "fwd_sdpa_error",
                           lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            if sdpa is not None:
                rec["fwd_sdpa_causal_ms"] = timed_ms(
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, reps, warmup)
                compare(rec, "fwd_sdpa", sdpa, reference, tol)
    del outs, reference

    # forward + backward (eager flex has no CPU backward)
    if a.no_backward:
        return rec
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def step(fn):
        def run():
            out = fn(qg, kg, vg, bm)
            qg.grad = kg.grad = vg.grad = None
            out.backward(grad)
            return [out.detach().clone(), qg.grad, kg.grad, vg.grad]
        return run

    results = {}
    # (on the CPU, torch's flex_attention has no backward, eager or compiled)
    trainers = [("eager", attend), ("torch_compile", tc), ("kiln", kc)] if device == "cuda" \
        else [("kiln", kc)]
    for key, fn in trainers:
        res = attempt(rec, f"fwd_bwd_{key}_error", step(fn))
        results[key] = res
        if res is not None:
            rec[f"fwd_bwd_{key}_ms"] = attempt(rec, f"fwd_bwd_{key}_error",
                                               lambda fn=fn: timed_ms(step(fn), device, reps, warmup))
    ref = results.get("eager") or results.get("torch_compile")
    if results.get("kiln") is not None and ref is not None:
        for name, got, want in zip(("out", "dq", "dk", "dv"), results["kiln"], ref, strict=True):
            compare(rec, f"fwd_bwd_kiln_{name}", got, want, tol * 2)
    if pattern == "causal":
        def sdpa_step():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            qg.grad = kg.grad = vg.grad = None
            out.backward(grad)
        if attempt(rec, "fwd_bwd_sdpa_error", sdpa_step) is None and "fwd_bwd_sdpa_error" not in rec:
            rec["fwd_bwd_sdpa_causal_ms"] = timed_ms(sdpa_step, device, reps, warmup)
    return rec


def run_decode_case(pattern: str, a, device: str, dtype: torch.dtype) -> dict:
    """Decoding: a ``--decode-q`` row query (the cache's last positions, a causal mask over
    the cache) over ``--decode-kv`` keys, batch ``--decode-B``; forward only, no grad."""
    B, H, D, Lq, S = a.decode_B, a.H, a.D, a.decode_q, a.decode_kv
    rec: dict = {"pattern": pattern, "B": B, "H": H, "L": S, "q_len": Lq, "D": D,
                 "dtype": str(dtype)}
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], device=device)

    def cache_causal(b, h, m, n):
        return n <= S - Lq + m

    def alibi(s, b, h, m, n):
        return s + slopes[h] * (n - m)

    score_mod = alibi if pattern == "decode_alibi" else None
    bm = create_block_mask(cache_causal, 1, 1, Lq, S, device=device, BLOCK_SIZE=a.block)

    def attend(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    g = torch.Generator(device=device).manual_seed(S)
    q = torch.randn(B, H, Lq, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, H, S, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 2e-4
    torch._dynamo.reset()
    kiln.reset()
    outs = {}
    for key, fn in (("eager", attend),
                    ("torch_compile", torch.compile(attend, fullgraph=True, mode=a.mode)),
                    ("kiln", kiln.compile(attend, fullgraph=True, mode=a.mode))):
        with torch.no_grad():
            t0 = time.perf_counter()
            out = attempt(rec, f"fwd_{key}_error", lambda fn=fn: fn(q, k, v, bm))
            sync(device)
            if key != "eager":
                rec[f"cold_{key}_s"] = round(time.perf_counter() - t0, 2)
            outs[key] = out.clone() if out is not None else None  # (a CUDA graph reuses it)
            if out is not None:
                rec[f"fwd_{key}_ms"] = attempt(rec, f"fwd_{key}_error", lambda fn=fn: timed_ms(
                    lambda: fn(q, k, v, bm), device, a.reps, a.warmup))
    from kiln_loopir.lowerings.higher_order import FLEX_KERNELS

    rec["kiln_kernel"] = type(FLEX_KERNELS[list(FLEX_KERNELS)[-1]]).__name__ if FLEX_KERNELS \
        else None
    reference = outs["eager"] if outs["eager"] is not None else outs["torch_compile"]
    rec["reference"] = "eager" if outs["eager"] is not None else "torch_compile"
    compare(rec, "fwd_kiln", outs["kiln"], reference, tol)
    compare(rec, "fwd_torch_compile", outs["torch_compile"], outs["eager"], tol)
    if outs["kiln"] is not None and rec.get("fwd_torch_compile_ms") and rec.get("fwd_kiln_ms"):
        rec["fwd_kiln_over_torch_compile"] = rec["fwd_kiln_ms"] / rec["fwd_torch_compile_ms"]
    return rec


# ------------------------------------------------------------------------------- main


def table(rows: list[dict]) -> str:
    cols = [("pattern", "pattern"), ("L", "L"), ("q_len", "q"), ("block_density", "density"),
            ("fwd_eager_ms", "fwd eager"), ("fwd_torch_compile_ms", "fwd tc"),
            ("fwd_kiln_ms", "fwd kiln"), ("fwd_sdpa_causal_ms", "fwd sdpa"),
            ("fwd_bwd_eager_ms", "f+b eager"), ("fwd_bwd_torch_compile_ms", "f+b tc"),
            ("fwd_bwd_kiln_ms", "f+b kiln"), ("fwd_bwd_sdpa_causal_ms", "f+b sdpa"),
            ("fwd_kiln_correct", "kiln ok")]

    def cell(r, key):
        v = r.get(key)
        if v is None:
            return "err" if any(k.startswith(key.rsplit("_ms", 1)[0]) and k.endswith("_error")
                                for k in r) else "-"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = [" | ".join(h for _, h in cols)]
    for r in rows:
        lines.append(" | ".join(cell(r, k) for k, _ in cols))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreter)")
    p.add_argument("--lengths", type=int, nargs="*", default=None)
    p.add_argument("--patterns", nargs="*", default=list(PATTERNS + DECODE_PATTERNS),
                   choices=PATTERNS + DECODE_PATTERNS)
    for name, default in (("B", 4), ("H", 16), ("D", 64), ("reps", 20), ("warmup", 5),
                          ("block", 128), ("window", 256), ("decode-B", 32), ("decode-q", 1),
                          ("decode-kv", 8192)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--mode", default=None, choices=(None, "reduce-overhead"),
                   help="both compilers' mode (reduce-overhead: CUDA graphs, no per-call host "
                        "overhead in the times)")
    p.add_argument("--merge", action="store_true",
                   help="keep the cases of an existing JSON that this run does not redo (a sweep "
                        "split over several runs, e.g. one --lengths each)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.smoke:
        a.B, a.H, a.D, a.block, a.window, a.reps, a.warmup = 1, 2, 16, 16, 16, 1, 0
        a.decode_B, a.decode_kv = 2, 80
        lengths = a.lengths or [48]
        device, dtype = "cpu", torch.float32
        out = a.out or os.path.join(HERE, "results", "flex_attention_gpu_smoke.json")
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --smoke for the CPU check")
        lengths = a.lengths or [1024, 4096, 8192]
        device, dtype = "cuda", torch.bfloat16
        out = a.out or os.path.join(HERE, "results", "flex_attention_gpu.json")
    torch._dynamo.config.cache_size_limit = 64
    options = {"codegen": "triton"} if a.smoke else None
    if options:  # the CPU smoke run compiles kiln's graphs with the Triton codegen
        real = kiln.compile

        def compile_with_triton(fn, **kw):
            return real(fn, options=options, **kw)

        kiln.compile = compile_with_triton
    rows = []
    for L in lengths:
        for pattern in a.patterns:
            if pattern in DECODE_PATTERNS:
                continue
            print(f"{pattern} L={L} ...", flush=True)
            rows.append(run_case(pattern, L, a, device, dtype))
            if device == "cuda":
                torch.cuda.empty_cache()
    for pattern in a.patterns:
        if pattern in DECODE_PATTERNS:
            print(f"{pattern} B={a.decode_B} q={a.decode_q} kv={a.decode_kv} ...", flush=True)
            rows.append(run_decode_case(pattern, a, device, dtype))
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
            "torch": torch.__version__, "smoke": a.smoke, "mode": a.mode,
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "note": "kiln: fused Triton forward and backward kernels; decode rows: kiln's "
                    "split-KV decoding kernel (kiln_kernel names the forward kiln ran)"}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if a.merge and os.path.exists(out):
        with open(out) as f:
            done = {(r["pattern"], r["L"]) for r in rows}
            rows = [r for r in json.load(f)["cases"] if (r["pattern"], r["L"]) not in done] + rows
            rows.sort(key=lambda r: (r["pattern"] in DECODE_PATTERNS, r["L"],
                                     (PATTERNS + DECODE_PATTERNS).index(r["pattern"])))
    with open(out, "w") as f:
        json.dump({"meta": meta, "cases": rows}, f, indent=1)
    print(table(rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
