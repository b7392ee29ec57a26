"""Small-batch GPU inference: kiln with and without CUDA graphs against eager and torch.compile.

    python benchmarks/gpu_runtime.py                   # on a CUDA machine (e.g. one H200)
    python benchmarks/gpu_runtime.py --models mlp --iters 50

Suite (random weights, no network): an 8-layer 1024-wide MLP at batch 8, timm resnet18 at
batch 1 (224x224), BERT-small (4 layers, hidden 512) at batch 1 sequence 128, GPT-2 small
(12 layers, hidden 768) at batch 1 sequence 128. Rows: eager, torch.compile default,
torch.compile ``mode="reduce-overhead"``, kiln default (no CUDA graphs), kiln
``mode="reduce-overhead"``. Each row: median milliseconds per call (CUDA-synchronized, after
warm-up), speedup over eager, max abs error against eager, and for kiln's CUDA-graph rows
what ``kiln.stats()`` says of recorded graphs, their memory and skips. Every row runs in its
own try/except (a failure is recorded, the run goes on); progress is printed as it goes.

Results: ``$OUT/gpu_runtime.json`` when ``$OUT`` is set, else
``benchmarks/results/gpu_runtime.json``. Targets (issue 13, torch.compile reduce-overhead on an
H200): 2.89x MLP (0.71x default mode), 7.4x resnet18, 11.0x BERT-small, 8.5x GPT-2 small.
Benchmarks only: torch.compile is the reference here, never in product code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"

MODELS = ("mlp", "resnet18", "bert_small", "gpt2_small")
VARIANTS = ("eager", "torch_default", "torch_reduce_overhead", "kiln_default",
            "kiln_reduce_overhead")


def log(msg: str) -> None:
    print(f"[gpu_runtime {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build(name: str):
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    if name == "mlp":
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).eval().to(dev), (torch.randn(8, 1024, device=dev),)
    if name == "resnet18":
        sys.path.insert(0, str(ROOT / "tests-integration"))
        import _torchvision_shim

        _torchvision_shim.install()
        import timm

        model = timm.create_model("resnet18", pretrained=False)
        return model.eval().to(dev), (torch.randn(1, 3, 224, 224, device=dev),)
    if name == "bert_small":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                            intermediate_size=2048)
        model = BertModel(config)
    elif name == "gpt2_small":
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(use_cache=False)
        model = GPT2Model(config)
    else:
        raise ValueError(f"unknown model {name!r}")

    from _common import last_hidden_state

    ids = torch.randint(0, config.vocab_size, (1, 128), device=dev)
    return last_hidden_state(model).eval().to(dev), (ids,)


def make(variant: str, model):
    import torch

    if variant == "eager":
        return model
    if variant.startswith("torch_"):
        mode = "reduce-overhead" if variant.endswith("reduce_overhead") else None
        return torch.compile(model, mode=mode)
    import kiln

    mode = "reduce-overhead" if variant.endswith("reduce_overhead") else None
    return kiln.compile(model, mode=mode)


def time_ms(fn, inputs, iters: int, warmup: int) -> tuple[float, float]:
    """(median ms per call, first-call seconds), CUDA-synchronized."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*inputs)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        fn(*inputs)
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*inputs)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(samples), first


def run_row(name: str, variant: str, model, inputs, expected, args) -> dict:
    import torch

    row: dict = {"model": name, "variant": variant}
    try:
        if variant.startswith("kiln"):
            import kiln

            kiln.reset_stats()
        fn = make(variant, model)
        with torch.no_grad():
            ms, first = time_ms(fn, inputs, args.iters, args.warmup)
            got = fn(*inputs)
            err = float((got.float() - expected.float()).abs().max())
        row.update(ms=ms, first_call_s=first, max_abs_err=err)
        if variant.startswith("kiln"):
            import kiln

            s = kiln.stats()
            row.update(graphs_compiled=s.graphs_compiled, eager_fallbacks=s.eager_fallbacks,
                       fallback_reasons=s.fallback_reasons,
                       interpreter_fallbacks=s.interpreter_fallbacks,
                       cudagraphs_recorded=s.cudagraphs_recorded,
                       cudagraph_memory_bytes=sum(s.cudagraph_memory.values()),
                       cudagraph_skips=s.cudagraph_skips)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
        row["traceback"] = traceback.format_exc()[-3000:]
    finally:
        try:
            import torch._dynamo

            torch._dynamo.reset()  # benchmark only: drop torch.compile's caches between rows
        except Exception:
            pass
        try:
            import kiln_frontend

            kiln_frontend.reset()  # each kiln row compiles afresh (code caches are per code object)
        except Exception:
            pass
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()

    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / "gpu_runtime.json"
    results: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "rows": [],
    }
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        out_path.write_text(json.dumps(results, indent=1))
        return
    for name in [m for m in args.models.split(",") if m]:
        try:
            model, inputs = build(name)
            with torch.no_grad():
                expected = model(*inputs)
        except Exception as e:
            log(f"{name}: could not build: {type(e).__name__}: {e}")
            results["rows"].append({"model": name, "error": f"build: {type(e).__name__}: {e}"})
            continue
        eager_ms = None
        for variant in [v for v in args.variants.split(",") if v]:
            log(f"{name} {variant} ...")
            row = run_row(name, variant, model, inputs, expected, args)
            if variant == "eager" and "ms" in row:
                eager_ms = row["ms"]
            if "ms" in row and eager_ms:
                row["speedup_vs_eager"] = eager_ms / row["ms"]
            results["rows"].append(row)
            out_path.write_text(json.dumps(results, indent=1))  # partial results survive a crash
            if "error" in row:
                log(f"{name} {variant}: ERROR {row['error']}")
            else:
                log(f"{name} {variant}: {row['ms']:.3f} ms, {row.get('speedup_vs_eager', 1.0):.2f}x "
                    f"vs eager, max err {row['max_abs_err']:.2e}")
        del model
        torch.cuda.empty_cache()

    print("\nmodel        variant                  ms     speedup")
    for row in results["rows"]:
        if "ms" in row:
            print(f"{row['model']:<12} {row['variant']:<22} {row['ms']:8.3f} "
                  f"{row.get('speedup_vs_eager', 1.0):6.2f}x")
        else:
            print(f"{row['model']:<12} {row.get('variant', '-'):<22} ERROR {row.get('error', '')[:60]}")
    log(f"wrote {out_path}")


if __name__ == "__main__":
    main()
