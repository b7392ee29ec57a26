"""int8 weight-only decode GEMMs: eager vs torch.compile vs kiln on the same subclass (issue 29).

    python benchmarks/quantized_gpu.py            # H200: bf16, 4096x4096, batch 1..32
    python benchmarks/quantized_gpu.py --smoke    # CPU, 256x256: every code path

The weight is ``kiln.testing.Int8WeightOnly`` (int8 payload, per-row bf16 scales, dequantized
in ``__torch_dispatch__``); the activation ``x [batch, 4096]`` is bf16 and the layer computes
``F.linear(x, W)``. Eager dequantizes the whole weight every call; a compiler can fuse the
dequantization into the matmul and read one byte per weight instead of writing and re-reading
two. For reference, the same GEMM on a dense bf16 weight (cuBLAS) and its time at the int8
payload's bandwidth. Each compiled output is checked against eager (``assert_close``, bf16
tolerances). Writes ``quantized_gpu.json`` in ``$OUT`` when set, else benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, first_line, fresh_cache_dirs, geomean, markdown_table, median_time  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    args = p.parse_args(argv)
    fresh_cache_dirs("kiln-quantized-")

    import kiln
    import kiln_frontend
    import torch
    import torch.nn.functional as F
    from kiln.testing import Int8WeightOnly

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    d = 256 if args.smoke else 4096

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        return median_time(fn, min_repeat_s=0.01 if args.smoke else 0.1, sync=sync)

    class Int8Linear(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = torch.nn.Parameter(Int8WeightOnly.quantize(w), requires_grad=False)

        def forward(self, x):
            return F.linear(x, self.weight)

    torch.manual_seed(0)
    w = (torch.randn(d, d, device=device) / d**0.5).to(dtype)
    layer = Int8Linear(w)
    dense = w.clone()
    rows = {}
    for b in (int(x) for x in args.batches.split(",")):
        x = torch.randn(b, d, device=device, dtype=dtype)
        row: dict = {}
        with torch.no_grad():
            expected = layer(x)
            row["eager_ms"] = timed(lambda x=x: layer(x)) * 1e3
            row["dense_bf16_ms"] = timed(lambda x=x: F.linear(x, dense)) * 1e3
            for label in ("torch.compile", "kiln"):
                try:
                    if label == "kiln":
                        kiln_frontend.reset()
                        compiled = kiln.compile(layer)
                    else:
                        torch._dynamo.reset()
                        compiled = torch.compile(layer)
                    t0 = time.perf_counter()
                    out = compiled(x)
                    sync()
                    cold = time.perf_counter() - t0
                    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
                    ms = timed(lambda f=compiled, x=x: f(x)) * 1e3
                    row[label] = {"ms": ms, "cold_s": cold, "speedup": row["eager_ms"] / ms}
                except Exception as e:
                    row[label] = {"error": first_line(e, 300)}
        rows[b] = row
        print(f"batch {b}: " + "; ".join(
            f"{k} {v['ms']:.4f} ms" if isinstance(v, dict) and "ms" in v else f"{k} {v}"
            for k, v in row.items()), flush=True)

    int8_bytes = d * d + d * 2
    table = []
    for b, r in rows.items():
        k, t = r.get("kiln", {}), r.get("torch.compile", {})
        table.append([b, f"{r['eager_ms']:.4f}", f"{r['dense_bf16_ms']:.4f}",
                      f"{t['ms']:.4f}" if "ms" in t else t.get("error", "")[:40],
                      f"{k['ms']:.4f}" if "ms" in k else k.get("error", "")[:40],
                      f"{t['ms'] / k['ms']:.2f}" if "ms" in k and "ms" in t else "-",
                      f"{int8_bytes / (k['ms'] * 1e-3) / 1e9:.0f}" if "ms" in k else "-"])
    text = markdown_table(["batch", "eager ms", "dense bf16 ms", "torch.compile ms", "kiln ms",
                           "kiln / torch.compile speed", "kiln GB/s of int8 weight"], table)
    ratios = [r["torch.compile"]["ms"] / r["kiln"]["ms"] for r in rows.values()
              if "ms" in r.get("kiln", {}) and "ms" in r.get("torch.compile", {})]
    summary = {"kiln_over_torch.compile_geomean": geomean(ratios),
               "slower_than_torch.compile_at": [b for b, r in rows.items()
                                                if "ms" in r.get("kiln", {}) and "ms" in r.get("torch.compile", {})
                                                and r["kiln"]["ms"] > r["torch.compile"]["ms"]]}
    print(text)
    print(json.dumps(summary))
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "shape": [d, d], "dtype": str(dtype)}
    name = "quantized_gpu_smoke.json" if args.smoke else "quantized_gpu.json"
    (out_dir / name).write_text(json.dumps({"env": meta, "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
